"""`bk shell`: admin and test commands against a cluster's metadata and bookies.

The metadata URI comes from --metadata-uri, else --conf FILE's
metadata_service_uri, else BK_METADATA_SERVICE_URI (commands that only read a
bookie's local files need none). --metadata-uri, --conf and --json go anywhere on
the command line. Output is human-readable on stdout; --json prints one JSON
document of machine fields for scripts. Exit code 0 on success, 1 on failure
(the error on stderr; with --json also a JSON error document on stdout).
`bk shell COMMAND --help` explains a command and its arguments.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import inspect
import json
import os
import sys
import time

from bk import eventloop
from bk.errors import BKError, ConfigError

from .commands import arg, at_least, command_table, one_of

# Every command is declared with @command (bk.cli.commands) in this module or in one
# named here (bk.cli.<name>); a new module is one more name in this list.
SHELL_MODULES = ("shell_recovery", "shell_ops", "shell_local", "shell_integrity", "shell_cookie", "shell_gc",
                 "shell_format", "shell_compact", "shell_meta", "shell_close", "shell_index")
COMMANDS, command = command_table()


def _add_common(parser, top: bool) -> None:
    """The options every shell command takes, before or after the command name. On the
    commands they default to SUPPRESS, so a value given before the name is kept."""
    kw = {} if top else {"default": argparse.SUPPRESS}
    parser.add_argument("--metadata-uri", help="zk://host:port/ledgers (default: --conf or BK_METADATA_SERVICE_URI)",
                        **kw)
    parser.add_argument("--conf", metavar="FILE", help="a bookie TOML file (metadata_service_uri, directories)", **kw)
    parser.add_argument("--json", action="store_true", help="print JSON (machine fields only)", **kw)


def _modules():
    import importlib
    return [importlib.import_module(f"bk.cli.{name}") for name in SHELL_MODULES]


def table() -> dict:
    """Every command by each of its names (BookKeeper's spellings too): this module's and
    SHELL_MODULES'. Two commands claiming one name is a programming error, raised here."""
    out: dict = {}
    for module in (sys.modules[__name__], *_modules()):
        for cmd in module.COMMANDS.values():
            for name in cmd.names:
                if name in out:
                    raise ValueError(f"shell command name {name} is declared by {out[name].fn.__module__} and "
                                     f"{cmd.fn.__module__}")
                out[name] = cmd
    return out


def _parser(cmds, name: str, help: str, description: str | None, raw: bool, args: tuple, aliases=()):
    c = cmds.add_parser(name, help=help, aliases=list(aliases), description=description or help,
                        formatter_class=argparse.RawDescriptionHelpFormatter if raw else argparse.HelpFormatter)
    for a in args:
        a.add_to(c)
    _add_common(c, top=False)
    return c


def add_parser(sub) -> None:
    p = sub.add_parser("shell", help="admin and test commands", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(p, top=True)
    cmds = p.add_subparsers(dest="shell_command", metavar="SHELL_COMMAND")
    cmds.required = True
    for cmd in sorted({id(c): c for c in table().values()}.values(), key=lambda c: c.name):
        c = _parser(cmds, cmd.name, cmd.help, cmd.description, cmd.raw_description, cmd.args, cmd.aliases)
        if cmd.actions:
            verbs = c.add_subparsers(dest=f"{cmd.name}_command", metavar="ACTION")
            verbs.required = True
            for a in cmd.actions:
                _parser(verbs, a.name, a.help, a.description, False, a.args)
    p.set_defaults(func=run)


def metadata_uri(args) -> str:
    if args.metadata_uri:
        return args.metadata_uri
    if args.conf:
        from bk.config import load_config
        return load_config(args.conf).metadata_service_uri
    uri = os.environ.get("BK_METADATA_SERVICE_URI")
    if uri:
        return uri
    raise ConfigError("no metadata service: give --metadata-uri URI, --conf FILE or set BK_METADATA_SERVICE_URI")


def run(args) -> int:
    cmd = table()[args.shell_command]
    try:
        uri = None if cmd.local else metadata_uri(args)
        result = cmd.fn(uri, args)
        if inspect.isawaitable(result):
            result = eventloop.run(result)
    except cmd.errors as e:
        if args.json:
            print(json.dumps({"ok": False, "error": str(e), "error_type": type(e).__name__}))
        print(f"bk shell {args.shell_command}: error: {e}", file=sys.stderr)
        return 1
    if args.json:  # machine fields only: the human text stays out
        body = {k: v for k, v in result.items() if k != "text"} if isinstance(result, dict) else result
        print(json.dumps(body, indent=2, default=str))
    elif isinstance(result, dict) and "text" in result:
        print(result["text"])
    return 0 if not (isinstance(result, dict) and result.get("ok") is False) else 1


async def _store(uri: str):
    from bk.meta import open_store
    return await open_store(uri)


# ---------------------------------------------------------------- commands
@command("initnewcluster", help="create the cluster's znodes (INSTANCEID, LAYOUT, ...)",
         args=(arg("--if-needed", action="store_true", help="succeed quietly when already initialised"),))
async def cmd_initnewcluster(uri, args):
    from bk.meta.cluster import init_new_cluster, is_initialized, read_instance_id
    store = await _store(uri)
    try:
        if await is_initialized(store):
            if not args.if_needed:
                raise BKError(f"the cluster at {uri} is already initialised (instance {await read_instance_id(store)})")
            instance = await read_instance_id(store)
            return {"ok": True, "instance_id": instance, "created": False, "text": f"already initialised: {instance}"}
        instance = await init_new_cluster(store)
        return {"ok": True, "instance_id": instance, "created": True, "text": f"initialised cluster {instance} at {uri}"}
    finally:
        await store.close()


@command("listbookies", help="list registered bookies",
         args=(arg("--readonly", action="store_true", help="list read-only bookies instead of writable ones"),
               arg("--all", action="store_true", help="list writable and read-only bookies")))
async def cmd_listbookies(uri, args):
    from bk.meta.registration import RegistrationManager
    store = await _store(uri)
    try:
        rm = RegistrationManager(store)
        writable = sorted(await rm.writable_bookies())
        readonly = sorted(await rm.readonly_bookies())
        await rm.close()
    finally:
        await store.close()
    if args.all:
        lines = [f"{b} (writable)" for b in writable] + [f"{b} (read-only)" for b in readonly]
        return {"writable": writable, "readonly": readonly, "text": "\n".join(lines) or "no bookies"}
    chosen = readonly if args.readonly else writable
    kind = "read-only" if args.readonly else "writable"
    return {"bookies": chosen, "text": "\n".join(chosen) or f"no {kind} bookies"}


@command("listledgers", help="list ledger ids")
async def cmd_listledgers(uri, args):
    from bk.meta.ledger_manager import LedgerManager
    store = await _store(uri)
    try:
        ids = sorted(await LedgerManager(store).list_ledger_ids())
    finally:
        await store.close()
    return {"ledgers": ids, "text": "\n".join(map(str, ids)) or "no ledgers"}


from bk.meta.ledger_metadata import metadata_dict  # noqa: E402 - re-exported for shell modules


@command("ledgermetadata", help="show, dump or restore one ledger's metadata",
         args=(arg("ledger_id", type=int, help="the ledger"),
               one_of(arg("--dump", metavar="FILE", help="write the metadata (binary, as stored) to FILE"),
                      arg("--restore", metavar="FILE", help="create the ledger's metadata from a --dump FILE")),
               arg("--force", action="store_true", help="with --restore: overwrite existing metadata")))
async def cmd_ledgermetadata(uri, args):
    from bk.meta.ledger_manager import LedgerManager
    if args.restore:
        return await _restore_metadata(uri, args)
    store = await _store(uri)
    try:
        md, version = await LedgerManager(store).read_ledger_metadata(args.ledger_id)
    finally:
        await store.close()
    if args.dump:
        data = md.serialize()
        with open(args.dump, "wb") as fh:
            fh.write(data)
        return {"ok": True, "ledger_id": args.ledger_id, "file": args.dump, "bytes": len(data),
                "text": f"wrote ledger {args.ledger_id}'s metadata ({len(data)} bytes) to {args.dump}"}
    d = metadata_dict(args.ledger_id, md, version)
    lines = [f"ledger {args.ledger_id} (znode version {version})",
             f"  state          {d['state']}",
             f"  quorums        E={md.ensemble_size} WQ={md.write_quorum_size} AQ={md.ack_quorum_size}",
             f"  last entry id  {md.last_entry_id}   length {md.length} bytes",
             f"  digest         {d['digest_type']}",
             f"  created        {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(md.ctime / 1000)) if md.ctime else '?'}",
             "  segments:"]
    lines += [f"    from entry {s['first_entry_id']:>8}: {', '.join(s['bookies'])}" for s in d["segments"]]
    d["text"] = "\n".join(lines)
    return d


async def _restore_metadata(uri, args):
    """Create (or with --force overwrite) a ledger's metadata from a --dump file."""
    from bk.errors import MetadataExistsError, NoSuchLedgerMetadataError
    from bk.meta.ledger_manager import LedgerManager
    from bk.meta.ledger_metadata import LedgerMetadata
    try:
        with open(args.restore, "rb") as fh:
            md = LedgerMetadata.deserialize(fh.read())
    except OSError as e:
        raise BKError(f"cannot read {args.restore}: {e.strerror}") from None
    store = await _store(uri)
    try:
        lm = LedgerManager(store)
        try:
            await lm.create_ledger_metadata(args.ledger_id, md)
            how = "created"
        except MetadataExistsError:
            if not args.force:
                raise BKError(f"ledger {args.ledger_id} has metadata already: --force to overwrite it") from None
            try:
                _, version = await lm.read_ledger_metadata(args.ledger_id)
            except NoSuchLedgerMetadataError:
                raise BKError(f"ledger {args.ledger_id}'s metadata vanished meanwhile: run again") from None
            await lm.write_ledger_metadata(args.ledger_id, md, version)
            how = "overwrote"
    finally:
        await store.close()
    return {"ok": True, "ledger_id": args.ledger_id, "restored_from": args.restore, "action": how,
            "text": f"{how} ledger {args.ledger_id}'s metadata from {args.restore}"}


@command("simpletest", help="write and read back a ledger; prints entries/s",
         args=(arg("--ensemble", type=int, default=3, help="ensemble size (default 3)"),
               arg("--write-quorum", type=int, default=2, help="write quorum size (default 2)"),
               arg("--ack-quorum", type=int, default=2, help="ack quorum size (default 2)"),
               arg("--entries", type=at_least(0), default=1000, help="entries to write (default 1000)"),
               arg("--entry-size", type=at_least(0), default=1024, help="bytes an entry (default 1024)"),
               arg("--in-flight", type=at_least(1), default=1000, help="adds outstanding at once (default 1000)"),
               arg("--keep", action="store_true", help="do not delete the ledger afterwards")))
async def cmd_simpletest(uri, args):
    from bk.client import BookKeeper
    payload = os.urandom(args.entry_size)
    async with BookKeeper(uri) as bkc:
        lh = await bkc.create_ledger(ensemble_size=args.ensemble, write_quorum_size=args.write_quorum,
                                     ack_quorum_size=args.ack_quorum, digest_type="CRC32C", password=b"")
        # A sliding window of callback adds (async_add_entry(data, callback)): no task or
        # future per add, so the figure is the cluster's, not the tool's.
        loop = asyncio.get_running_loop()
        issued: list[float] = []  # by entry id (a new ledger starts at 0)
        lat: list[float] = []
        state = {"in_flight": 0, "error": None, "waiter": None}

        def done(entry_id, err) -> None:
            state["in_flight"] -= 1
            if err is not None:
                state["error"] = state["error"] or err
            else:
                lat.append(time.perf_counter() - issued[entry_id])
            waiter = state["waiter"]
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

        async def completion() -> None:
            # callbacks run only while this coroutine waits, so none is missed
            state["waiter"] = loop.create_future()
            await state["waiter"]

        t0 = time.perf_counter()
        for _ in range(args.entries):
            while state["in_flight"] >= args.in_flight and state["error"] is None:
                await completion()
            if state["error"] is not None:
                break
            issued.append(time.perf_counter())
            lh.async_add_entry(payload, done)
            state["in_flight"] += 1
        while state["in_flight"] and state["error"] is None:
            await completion()
        if state["error"] is not None:
            raise state["error"]
        write_s = time.perf_counter() - t0
        await lh.close()
        rh = await bkc.open_ledger(lh.ledger_id, password=b"", recovery=False)
        t1 = time.perf_counter()
        entries = await rh.read_entries(0, rh.last_add_confirmed) if args.entries else []
        read_s = time.perf_counter() - t1
        bad = sum(1 for e in entries if bytes(e.data) != payload)
        if len(entries) != args.entries or bad:
            raise BKError(f"read back {len(entries)} entries ({bad} differ), wrote {args.entries}")
        if not args.keep:
            await bkc.delete_ledger(lh.ledger_id)
    lat.sort()
    pct = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000) if lat else (lambda q: 0.0)
    d = {"ok": True, "ledger_id": lh.ledger_id, "entries": args.entries, "entry_size": args.entry_size,
         "ensemble": args.ensemble, "write_quorum": args.write_quorum, "ack_quorum": args.ack_quorum,
         "write_entries_per_s": round(args.entries / write_s) if write_s else None,
         "write_mb_per_s": round(args.entries * args.entry_size / write_s / 1e6, 2) if write_s else None,
         "read_entries_per_s": round(args.entries / read_s) if read_s else None,
         "add_latency_ms": {"p50": round(pct(0.5), 3), "p99": round(pct(0.99), 3)}}
    d["text"] = (f"wrote {args.entries} entries of {args.entry_size} B to ledger {lh.ledger_id} "
                 f"(E={args.ensemble} WQ={args.write_quorum} AQ={args.ack_quorum}): "
                 f"{d['write_entries_per_s']:,} entries/s, {d['write_mb_per_s']} MB/s, "
                 f"add p50 {d['add_latency_ms']['p50']} ms p99 {d['add_latency_ms']['p99']} ms; "
                 f"read back {d['read_entries_per_s']:,} entries/s, all identical")
    return d


def _render(data: bytes, fmt: str) -> str:
    if fmt == "hex":
        return data.hex()
    if fmt == "base64":
        return base64.b64encode(data).decode()
    return data.decode("utf-8", errors="backslashreplace")


@command("readledger", help="print a ledger's entries",
         args=(arg("ledger_id", type=int, help="the ledger"),
               arg("--first", type=int, default=0, help="first entry id (default 0)"),
               arg("--last", type=int, default=None, help="last entry id (default: the last confirmed entry)"),
               arg("--password", default="", help="the ledger's password (default empty)"),
               arg("--recover", action="store_true", help="open with recovery (fences and closes an open ledger)"),
               arg("--format", choices=["text", "hex", "base64"], default="text",
                   help="how payloads are printed (default text)"),
               arg("--bookie", default=None, metavar="BOOKIE_ID",
                   help="read from this bookie only (entries it does not hold are skipped)")))
async def cmd_readledger(uri, args):
    from bk.client import BookKeeper
    if args.bookie:
        from .shell_ops import read_from_bookie
        got = await read_from_bookie(uri, args.ledger_id, args.bookie, args.first, args.last)
        rows = [{"entry_id": eid, "data": _render(data, args.format)} for eid, data in got]
        text = "\n".join(f"{r['entry_id']}\t{r['data']}" for r in rows) or f"no entries on {args.bookie}"
        return {"ledger_id": args.ledger_id, "bookie_id": args.bookie, "entries": rows, "text": text}
    async with BookKeeper(uri) as bkc:
        rh = await bkc.open_ledger(args.ledger_id, password=args.password.encode(), recovery=args.recover)
        last = rh.last_add_confirmed if args.last is None else args.last
        entries = await rh.read_entries(args.first, last) if last >= args.first else []
    rows = [{"entry_id": e.entry_id, "data": _render(bytes(e.data), args.format if args.json else args.format)}
            for e in entries]
    text = "\n".join(f"{r['entry_id']}\t{r['data']}" for r in rows) or "no entries"
    return {"ledger_id": args.ledger_id, "entries": rows, "text": text}


@command("deleteledger", help="delete a ledger",
         args=(arg("ledger_id", type=int, help="the ledger"),
               arg("--force", action="store_true", help="do not ask")))
async def cmd_deleteledger(uri, args):
    from bk.client import BookKeeper
    if not args.force and sys.stdin.isatty():
        answer = input(f"delete ledger {args.ledger_id}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            return {"ok": False, "text": "not deleted"}
    async with BookKeeper(uri) as bkc:
        await bkc.delete_ledger(args.ledger_id)
    return {"ok": True, "ledger_id": args.ledger_id, "text": f"deleted ledger {args.ledger_id}"}
