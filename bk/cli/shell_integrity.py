"""`bk shell` commands for running without the journal (BP-46; declared with @command).

    fixcookie            (with --conf FILE of a STOPPED bookie) the cookie fix by hand: check the
                         bookie's directories against its cookie in the metadata store; where
                         directories lost their cookies (a replaced or wiped disk), run phase one
                         (put every ledger of the bookie in limbo and fence those BookKeeper fences, durably) and then
                         stamp the cookie into them. The bookie repairs the rest from its peers
                         (phase two) when it next starts.
    repairstatus [ID]    each live bookie's self-repair progress: ledgers left, entries and bytes
                         copied, errors (published by the bookie in its registration).
    entrylogcheck        (with --conf FILE of a STOPPED bookie; local files only) the check every
                         start runs (bk.bookie.log_check): which entry logs the index names, which
                         are missing or cut short, how many entries of which ledgers are gone with
                         them. Exit status 1 when any are. The bookie finds the same at its next
                         start, puts those ledgers in limbo and copies the entries from its peers.
"""
from __future__ import annotations

import time

from bk.errors import BKError, ConfigError, CookieError

from .commands import arg, command_table

COMMANDS, command = command_table()
REPAIR_PREFIX = "repair."


@command(
    "fixcookie", help="BP-46: repair a stopped bookie whose directories lost their cookies (needs --conf)",
    description="Run with the bookie stopped: `bk shell --conf bookie.toml fixcookie`. Where the bookie's"
                " directories lost their cookies (a replaced or wiped disk), put every ledger of the bookie in"
                " limbo and fence it (the open ones only when their last ensemble names the bookie) (BP-46 phase"
                " one: it never answers 'no such entry' for what it may have"
                " lost), make that durable, then stamp the cookie. The bookie copies what it lost from its"
                " peers when it next starts. A cookie that differs (another address, other directories,"
                " another cluster) is not fixed here: see `bk shell cookie`.",
    args=(arg("--dry-run", action="store_true", help="only report what the check finds"),))
async def cmd_fixcookie(uri, args):
    from bk.bookie import Bookie
    from bk.config import load_config
    from bk.meta import open_store
    from bk.meta.cookie import cookie_directories, stamp_cookies, verify_cookies
    from bk.meta.registration import RegistrationManager
    from bk.server import integrity

    if not args.conf:
        raise ConfigError("fixcookie needs the stopped bookie's configuration: bk shell --conf FILE fixcookie")
    cfg = load_config(args.conf)
    bookie_id = cfg.bookie_id
    store = await open_store(uri)
    try:
        if await RegistrationManager(store).registration(bookie_id) is not None:
            raise CookieError(f"bookie {bookie_id} is registered as running: stop it first")
        check = await verify_cookies(store, bookie_id, cfg.journal_dirs, cfg.ledger_dirs, cfg.index_dir or None,
                                     allow_repair=True)
        out = {"ok": True, "bookie_id": bookie_id, "problems": list(check.problems),
               "missing_dirs": list(check.missing_dirs), "new_bookie": check.new_bookie}
        if not check.problems:
            out["text"] = (f"bookie {bookie_id}: " + ("new bookie, cookies stamped" if check.new_bookie
                                                      else "every cookie matches; nothing to fix"))
            return out
        if not integrity.repairable(check):
            raise CookieError(f"bookie {bookie_id}: not a lost cookie, fixcookie does not change this: "
                              + " | ".join(check.problems))
        if args.dry_run:
            out["text"] = (f"bookie {bookie_id}: lost cookies in {', '.join(check.missing_dirs)}; fixcookie would"
                           " limbo (and fence) its ledgers, then stamp them (dry run: nothing changed)")
            return out
        t0 = time.monotonic()
        bookie = Bookie(cfg)
        await bookie.start()
        try:
            result = await integrity.run_phase_one(store, bookie, bookie_id, "fixcookie: lost cookies in "
                                                   + ", ".join(check.missing_dirs))
        finally:
            await bookie.stop()  # phase one is durable; the needs-integrity-check flag stays set
        await stamp_cookies(store, check.cookie, cookie_directories(check.cookie), check.zk_version)
        out.update(result.as_dict(), stamped=list(check.missing_dirs), elapsed_s=round(time.monotonic() - t0, 3))
        out["text"] = (f"bookie {bookie_id}: {result.ledgers_marked} of {result.ledgers_scanned} ledgers in limbo"
                       f" ({result.ledgers_fenced} of them fenced); cookie stamped into {', '.join(check.missing_dirs)}. Start the bookie: it"
                       " copies what it lost from its peers (bk shell repairstatus shows progress).")
        return out
    finally:
        await store.close()


@command(
    "entrylogcheck", local=True,
    help="which entry logs a stopped bookie's index names and which are missing or cut short",
    description="Run with the bookie stopped: `bk shell --conf bookie.toml entrylogcheck [--json]`. Reads"
                " only: the index (one walk) and the entry log files. Exit status 1 when entries are gone"
                " with their logs (a wiped ledger dir, a deleted or truncated log); the bookie's next start"
                " finds the same, puts their ledgers in limbo and copies them back from its peers.")
async def cmd_entrylogcheck(uri, args):
    import asyncio
    import os

    from bk.bookie.log_check import check_entry_logs
    from bk.config import load_config
    from bk.index import Index

    cfg = load_config(args.conf)
    path = cfg.resolved_index_dir
    if not os.path.isdir(path):
        raise ConfigError(f"no index at {path}: give the stopped bookie's configuration with --conf FILE")

    def check():
        index = Index(path, cfg, readonly=True)
        try:
            return check_entry_logs(index, cfg.ledger_dirs, cfg.max_frame_size_bytes)
        finally:
            index.close()
    found = await asyncio.to_thread(check)
    out = found.as_dict()
    lines = [found.summary()]
    lines += [f"  log {d.log_id:x}: {d.state}" + (f" ({d.file_bytes} bytes, gone from offset {d.dead_from})"
                                                 if d.state == "truncated" else "")
              + f", {d.dead} of the {d.named} entries the index names there are gone" for d in found.dead_logs]
    if found.ledgers:
        lines.append("  ledgers: " + ", ".join(f"{lid} ({n})" for lid, n in sorted(found.ledgers.items())[:50])
                     + (" ..." if len(found.ledgers) > 50 else ""))
        lines.append("start the bookie: it puts these ledgers in limbo and copies the entries from its peers"
                     " (bk shell repairstatus shows progress)")
    out["text"] = "\n".join(lines)
    return out


def _repair_of(info) -> dict | None:
    props = {k[len(REPAIR_PREFIX):]: v for k, v in info.properties if k.startswith(REPAIR_PREFIX)}
    if not props:
        return None
    out = {}
    for k, v in props.items():
        try:
            out[k] = float(v) if "." in v else int(v)
        except ValueError:
            out[k] = v
    return out


async def _statuses(uri, bookie_id: str | None) -> list[dict]:
    from bk.meta import open_store
    from bk.meta.registration import RegistrationManager

    store = await open_store(uri)
    try:
        rm = RegistrationManager(store, reregister_on_expiry=False)
        try:
            ids = sorted({*await rm.writable_bookies(), *await rm.readonly_bookies()})
            if bookie_id is not None:
                if bookie_id not in ids:
                    raise BKError(f"bookie {bookie_id} is not registered (not running?)")
                ids = [bookie_id]
            bookies = []
            for bid in ids:
                info = await rm.get_service_info(bid)
                bookies.append({"bookie_id": bid, "repair": _repair_of(info) if info is not None else None})
            return bookies
        finally:
            await rm.close()
    finally:
        await store.close()


def _line(b: dict) -> str:
    r = b["repair"]
    if r is None:
        return f"{b['bookie_id']}: no repair since it started"
    return (f"{b['bookie_id']}: {r.get('state')}: {r.get('ledgers_left')} of {r.get('ledgers_total')}"
            f" ledgers left, {r.get('ledgers_recovered')} recovered, {r.get('entries_lost', 0)} entries lost with"
            f" entry logs, {r.get('entries_copied')} entries"
            f" ({r.get('bytes_copied')} bytes) copied, {r.get('errors')} errors, {r.get('elapsed_s')}s")


@command("repairstatus", help="BP-46: each live bookie's self-repair progress",
         args=(arg("bookie_id", nargs="?", default=None, help="only this bookie (host:port)"),
               arg("--watch", action="store_true",
                   help="with BOOKIE_ID: follow its repair (a progress bar on a terminal) until it is done"),
               arg("--timeout", type=float, default=None, metavar="S",
                   help="with --watch: give up after S seconds")))
async def cmd_repairstatus(uri, args):
    if args.watch:
        return await _watch(uri, args)
    bookies = await _statuses(uri, args.bookie_id)
    return {"ok": True, "bookies": bookies, "text": "\n".join(map(_line, bookies)) or "no bookie is registered"}


async def _watch(uri, args):
    import asyncio

    from .progress import progress_bar

    if args.bookie_id is None:
        raise BKError("--watch follows one bookie: give its id")
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    with progress_bar(desc=f"repair {args.bookie_id}", unit="ledger", quiet=args.json) as bar:
        while True:
            b = (await _statuses(uri, args.bookie_id))[0]
            r = b["repair"]
            if r is not None:
                bar.update_to(int(r.get("ledgers_done", 0)), int(r.get("ledgers_total", 0)) or None,
                              postfix=f"{r.get('bytes_copied', 0) / 1e6:.1f} MB copied, {r.get('errors', 0)} errors")
                if r.get("state") == "done":
                    break
            if deadline is not None and time.monotonic() > deadline:
                return {"ok": False, "bookies": [b], "text": _line(b) + f" (still not done after {args.timeout:g}s)"}
            await asyncio.sleep(0.5)
    return {"ok": True, "bookies": [b], "text": _line(b)}
