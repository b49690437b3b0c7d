"""`bk shell` commands that change or read ledger and bookie metadata (declared with @command).

    updateledgers -bookieId hostname|ip          this bookie's id in every ledger: old form -> new form
    updatebookieinledger -srcBookie A -destBookie B   bookie A -> bookie B in every ledger's ensembles
    endpointinfo -b BOOKIE_ID                    the endpoints and properties a bookie registered
    forceauditchecks [-calc] [-ppc] [-rc]        the auditor's next start runs those checks at once
    initbookie                                   this bookie (--conf) may start as a new one

The two update commands are BookKeeper's UpdateLedgerOp: every ledger whose ensembles
name the old bookie gets it replaced, one compare-and-set metadata write per ledger (a
ledger changed meanwhile is re-read and re-decided, never overwritten), at most
-updatespersec writes a second, stopping after -limit ledgers. They refuse while the old
bookie is registered (running): its ledgers' new owner must already hold the data (a
moved disk, a renamed host), and a running bookie would keep serving under the old id.
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import sys
import time

from bk.errors import BKError, ConfigError

from .commands import arg, at_least, command_table
from .progress import progress_bar

COMMANDS, command = command_table()
log = logging.getLogger("bk.shell")


# BookKeeper's UpdateLedgerOp options, shared by updateledgers and updatebookieinledger
UPDATE_ARGS = (
    arg("-updatespersec", "--updates-per-sec", dest="updates_per_sec", type=at_least(1), default=5,
        help="metadata writes per second (default 5)"),
    arg("-maxOutstandingReads", "--max-outstanding-reads", dest="max_outstanding_reads", type=at_least(1),
        default=25, help="metadata reads in flight while scanning (default 25)"),
    arg("-limit", "--limit", dest="limit", type=at_least(1), default=None,
        help="update at most this many ledgers (default: all)"),
    arg("-verbose", "-v", "--verbose", dest="verbose", action="store_true", help="print every ledger updated"),
    arg("-printprogress", "--print-progress", dest="print_progress", type=at_least(0), default=10,
        help="without a terminal, print progress every N seconds (0: never; default 10)"),
    arg("--force", action="store_true", help="do not ask (on a terminal)"),
)


def _confirm(args, question: str) -> bool:
    if args.force or args.json or not sys.stdin.isatty():
        return True
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


async def _open(uri):
    from bk.meta import open_store
    return await open_store(uri)


def _replaced(current, src: str, dst: str):
    """`current` with src replaced by dst in each ensemble naming it (None: nothing to do)."""
    if src not in current.bookies():
        return None
    segments = []
    for first, bookies in current.segments:
        if src in bookies:
            if dst in bookies:
                raise BKError(f"the ensemble from entry {first} has both {src} and {dst}: replacing would name "
                              f"{dst} twice")
            bookies = tuple(dst if b == src else b for b in bookies)
        segments.append((first, bookies))
    return current.replace(segments=tuple(segments))


async def replace_bookie(uri, src: str, dst: str, args) -> dict:
    """Rewrite src -> dst in every ledger's ensembles (UpdateLedgerOp); returns the command's result."""
    from bk.errors import MetadataStoreError, NoSuchLedgerMetadataError
    from bk.meta.ledger_manager import LedgerManager
    from bk.meta.registration import RegistrationManager, split_bookie_id
    for b in (src, dst):
        try:
            split_bookie_id(b)
        except MetadataStoreError as e:
            raise ConfigError(str(e)) from None
    if src == dst:
        raise ConfigError(f"source and destination are the same bookie {src}")
    store = await _open(uri)
    try:
        rm = RegistrationManager(store)
        live = set(await rm.writable_bookies()) | set(await rm.readonly_bookies())
        if src in live:
            raise BKError(f"bookie {src} is registered (running): stop it before moving its ledgers to {dst}")
        lm = LedgerManager(store)
        candidates = [lid async for lid, md, _ in lm.iter_ledger_metadata(concurrency=args.max_outstanding_reads)
                      if src in md.bookies()]
        if args.limit is not None:
            candidates = candidates[:args.limit]
        if candidates and not _confirm(args, f"replace {src} by {dst} in {len(candidates)} ledgers?"):
            return {"ok": False, "updated": [], "text": "nothing changed"}
        updated, failed = [], {}
        interval, next_at = 1.0 / args.updates_per_sec, time.monotonic()
        last_note = time.monotonic()
        with progress_bar(total=len(candidates), desc="ledgers", unit="ledger", quiet=args.json) as bar:
            for n, lid in enumerate(candidates):
                delay = next_at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                next_at = max(next_at, time.monotonic()) + interval
                changed = []  # the versions this command's own writes replaced

                def update(md, _changed=changed):
                    new = _replaced(md, src, dst)
                    _changed.append(new is not None)
                    return new
                try:
                    _, version = await lm.update_ledger_metadata(lid, update)
                except NoSuchLedgerMetadataError:
                    continue  # deleted meanwhile: nothing of it to move
                except BKError as e:
                    failed[lid] = str(e)
                    log.warning("ledger %d: not updated: %s", lid, e)
                else:
                    if changed and changed[-1]:
                        updated.append(lid)
                        log.info("ledger %d: %s -> %s in its ensembles (metadata version now %d)", lid, src, dst,
                                 version)
                        if args.verbose:
                            bar.note(f"ledger {lid}: {src} -> {dst}")
                bar.update_to(n + 1, postfix=f"{len(updated)} updated")
                if not bar.tty and args.print_progress and time.monotonic() - last_note >= args.print_progress:
                    bar.note(f"ledgers issued={n + 1}, updated={len(updated)}")
                    last_note = time.monotonic()
    finally:
        await store.close()
    text = [f"replaced {src} by {dst} in {len(updated)} of {len(candidates)} ledgers naming it"]
    text += [f"  ledger {lid}: FAILED: {why}" for lid, why in sorted(failed.items())]
    return {"ok": not failed, "src_bookie": src, "dest_bookie": dst, "updated": updated,
            "failed": {str(k): v for k, v in failed.items()}, "text": "\n".join(text)}


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


def old_and_new_ids(cfg, form: str) -> tuple[str, str]:
    """(old id, new id) of the bookie of `cfg` whose id now has the form `form` (hostname|ip)."""
    host, port = cfg.advertised_address, cfg.bookie_port
    if form == "hostname":
        if _is_ip(host):
            raise ConfigError(f"-bookieId hostname: the bookie's advertised_address is the IP address {host}; "
                              "set it to the host's name first")
        try:
            old = socket.gethostbyname(host)
        except OSError as e:
            raise ConfigError(f"cannot resolve {host}: {e}") from None
    else:
        if not _is_ip(host):
            raise ConfigError(f"-bookieId ip: the bookie's advertised_address is the host name {host}; "
                              "set it to the IP address first")
        try:
            old = socket.gethostbyaddr(host.strip("[]"))[0]
        except OSError as e:
            raise ConfigError(f"no host name for {host}: {e}") from None
    return f"{old}:{port}", f"{host}:{port}"


@command(
    "updateledgers", help="replace this bookie's old id by its new one (hostname <-> ip) in every ledger",
    description="BookKeeper's updateledgers: after a bookie switched its id between its IP address and its "
                "host name (advertised_address), rewrite the id in every ledger's ensembles. The new id is "
                "the bookie's from --conf; the old one is the same port with the other form of its address. "
                "Run `bk shell cookie update` for the bookie's cookie too, with the bookie stopped.",
    args=(arg("-bookieId", "--bookie-id", dest="bookie_id", choices=["hostname", "ip"], required=True,
              help="the form of the NEW id: hostname (advertised_address is a host name) or ip"),
          *UPDATE_ARGS))
async def cmd_updateledgers(uri, args):
    from bk.config import load_config
    if not args.conf:
        raise ConfigError("updateledgers needs the bookie's settings: `bk shell --conf bookie.toml updateledgers`")
    old, new = old_and_new_ids(load_config(args.conf), args.bookie_id)
    return await replace_bookie(uri, old, new, args)


@command(
    "updatebookieinledger", aliases=("updateBookieInLedger",),
    help="replace one bookie id by another in every ledger's ensembles",
    description="BookKeeper's updateBookieInLedger: rewrite ensembles naming the source bookie to name the "
                "destination bookie (which must hold the source's data, e.g. its disks were moved). "
                "Refused while the source bookie is registered.",
    args=(arg("-srcBookie", "-sb", "--src-bookie", dest="src_bookie", required=True, metavar="HOST:PORT",
              help="the bookie id to replace"),
          arg("-destBookie", "-db", "--dest-bookie", dest="dest_bookie", required=True, metavar="HOST:PORT",
              help="the bookie id that replaces it"),
          *UPDATE_ARGS))
async def cmd_updatebookieinledger(uri, args):
    return await replace_bookie(uri, args.src_bookie, args.dest_bookie, args)


@command(
    "endpointinfo", help="the endpoints and properties a bookie registered",
    description="BookKeeper's endpointinfo: the BookieServiceInfo a bookie published at its "
                "registration (bookie-rpc, http, ...). Fails for an unknown bookie, or one "
                "that published no endpoint (it may be down).",
    args=(arg("-b", "-bookieid", "--bookieid", dest="bookie", required=True, metavar="BOOKIE_ID",
              help="the bookie, host:port"),))
async def cmd_endpointinfo(uri, args):
    from bk.meta.registration import RegistrationManager
    store = await _open(uri)
    try:
        rm = RegistrationManager(store)
        known = set(await rm.known_bookies()) | set(await rm.writable_bookies()) | set(await rm.readonly_bookies())
        if args.bookie not in known:
            raise BKError(f"bookie {args.bookie} does not exist; known bookies: {', '.join(sorted(known)) or 'none'}")
        info = await rm.get_service_info(args.bookie)
    finally:
        await store.close()
    if info is None or not info.endpoints:
        raise BKError(f"bookie {args.bookie} published no endpoint: it may be down")
    endpoints = [{"id": e.id, "protocol": e.protocol, "host": e.host, "port": e.port, "auth": list(e.auth),
                  "extensions": list(e.extensions)} for e in info.endpoints]
    lines = [f"bookie {args.bookie}"]
    lines += [f"  property {k}: {v}" for k, v in info.properties]
    lines += [f"  endpoint {e['id']}: {e['protocol']} {e['host']}:{e['port']}"
              f"{' auth ' + ','.join(e['auth']) if e['auth'] else ''}"
              f"{' extensions ' + ','.join(e['extensions']) if e['extensions'] else ''}" for e in endpoints]
    return {"ok": True, "bookie_id": args.bookie, "properties": dict(info.properties), "endpoints": endpoints,
            "text": "\n".join(lines)}


FORCED_CHECK_AGE_MS = 21 * 24 * 3600 * 1000  # BookKeeper's: longer than any check's usual interval


@command(
    "forceauditchecks", help="make the auditor's next start run the chosen periodic checks at once",
    description="BookKeeper's forceauditchecks: set the recorded last run of the chosen auditor checks 21 "
                "days back, so the auditor runs them as soon as it (re)starts; restart the auditor (its "
                "AutoRecovery) afterwards. bk's auditor has no replicas check: -rc sets the znode "
                "BookKeeper's own auditors read.",
    args=(arg("-calc", "--checkallledgerscheck", dest="calc", action="store_true",
              help="the ledger check (every ledger's bookies probed)"),
          arg("-ppc", "--placementpolicycheck", dest="ppc", action="store_true", help="the placement check"),
          arg("-rc", "--replicascheck", dest="rc", action="store_true", help="the replicas check")))
async def cmd_forceauditchecks(uri, args):
    from bk.meta.underreplication import LedgerUnderreplicationManager
    chosen = [name for name, on in (("checkallledgers", args.calc), ("placementpolicycheck", args.ppc),
                                    ("replicascheck", args.rc)) if on]
    if not chosen:
        raise ConfigError("choose at least one check: -calc, -ppc and/or -rc (nothing was changed)")
    ctime = int(time.time() * 1000) - FORCED_CHECK_AGE_MS
    store = await _open(uri)
    try:
        urm = LedgerUnderreplicationManager(store)
        try:
            for name in chosen:
                await urm.set_check_ctime(name, ctime)
                log.info("auditor check %s: last run set to %s", name, time.strftime(
                    "%Y-%m-%d %H:%M:%S", time.localtime(ctime / 1000)))
        finally:
            await urm.close()
    finally:
        await store.close()
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ctime / 1000))
    return {"ok": True, "checks": chosen, "ctime_ms": ctime,
            "text": f"last run of {', '.join(chosen)} set to {when}: restart the auditor to run them now"}


@command(
    "initbookie", help="check that this bookie (--conf) can start as a new one: empty dirs, no cookie",
    description="BookKeeper's initbookie: succeeds only when the bookie's journal, ledger and index "
                "directories are missing or empty, the cluster is initialised, and its bookie id is neither "
                "registered (running) nor has a cookie in the metadata store. It changes nothing: the bookie "
                "creates its directories and cookie at its first start. To reuse a bookie id, "
                "`bookieformat --delete-cookie` first.")
async def cmd_initbookie(uri, args):
    import os

    from bk.config import load_config
    from bk.errors import MetadataNotFoundError
    from bk.meta.cluster import is_initialized
    from bk.meta.cookie import CookieStore
    from bk.meta.registration import RegistrationManager
    if not args.conf:
        raise ConfigError("initbookie checks one bookie: `bk shell --conf bookie.toml initbookie`")
    cfg = load_config(args.conf)
    dirs = [("journal dir", d) for d in cfg.journal_dirs] + [("ledger dir", d) for d in cfg.ledger_dirs]
    if cfg.index_dir:
        dirs.append(("index dir", cfg.index_dir))
    for kind, d in dirs:
        if os.path.isdir(d) and os.listdir(d):
            raise BKError(f"{kind} {d} exists and is not empty: format the bookie first (bookieformat)")
    bookie = cfg.bookie_id
    store = await _open(uri)
    try:
        if not await is_initialized(store):
            raise BKError(f"the cluster at {uri} is not initialised: run initnewcluster first")
        rm = RegistrationManager(store)
        if bookie in set(await rm.writable_bookies()) | set(await rm.readonly_bookies()):
            raise BKError(f"bookie {bookie} is registered: if a bookie process runs with this id, stop it first")
        try:
            await CookieStore(store).read(bookie)
        except MetadataNotFoundError:
            pass
        else:
            raise BKError(f"bookie {bookie} still has a cookie in the metadata store: format the bookie first "
                          "(bookieformat --delete-cookie)")
    finally:
        await store.close()
    return {"ok": True, "bookie_id": bookie, "directories": [d for _, d in dirs],
            "text": f"bookie {bookie} can start as a new bookie: its directories are empty and it has no cookie"}
