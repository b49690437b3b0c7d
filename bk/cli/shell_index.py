"""`bk shell` commands on one bookie's index and entry logs (declared with @command).

    ledger LEDGER [-m]        BookKeeper's `ledger`: every entry the index holds for the
                              ledger and where it lies (entry log, offset); N/A for an
                              entry id missing between the first and the last; -m adds
                              the ledger's record (master key, fenced, limbo, explicit LAC)
    activeledgers -logId N    BookKeeper's `activeledgers`: the ledgers with data in entry
                              log N that still exist in the metadata store

Both read the bookie's files only (the index opened read-only: the bookie may run);
directories come from --ledger-dirs/--index-dir or `bk shell --conf bookie.toml`.
activeledgers also lists the ledgers of the metadata store.
"""
from __future__ import annotations

import asyncio
import os

from bk.errors import BKError

from .commands import arg, at_least, command_table

COMMANDS, command = command_table()


def _log_id(text: str) -> int:
    import argparse
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a log id (decimal, or hex with 0x)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"log id {value} < 0")
    return value


DIR_ARGS = (arg("--ledger-dirs", nargs="+", metavar="DIR", help="the bookie's ledger dirs"),
            arg("--index-dir", metavar="DIR", help="its index dir (default: as the bookie)"))


def _index(args):
    from bk.index import Index

    from .shell_gc import _config
    cfg = _config(args)
    path = cfg.resolved_index_dir
    if not os.path.exists(os.path.join(path, "data.mdb")):
        raise BKError(f"no index at {path}")
    return Index(path, cfg, readonly=True)


@command(
    "ledger", local=True, help="one ledger's entries in this bookie's index and where each lies",
    description="BookKeeper's `ledger`: dump the index entries of one ledger (local files; "
                "the index is opened read-only, so the bookie may run).",
    args=(arg("ledger_id", type=at_least(0), help="the ledger"),
          arg("-m", "--meta", action="store_true", help="also print the ledger's record in the index"),
          *DIR_ARGS))
async def cmd_ledger(uri, args):
    from bk.formats.entrylog import split_location
    lid = args.ledger_id
    idx = _index(args)
    try:
        state = idx.get_ledger(lid)
        ids = idx.entry_ids(lid)
        locations = idx.get_locations([(lid, e) for e in ids])
    finally:
        idx.close()
    if state is None and not ids:
        raise BKError(f"ledger {lid} is not in this bookie's index")
    rows, lines = [], [f"===== LEDGER: {lid} ====="]
    if args.meta and state is not None:
        lines += [f"master key   : {state.master_key.hex() if state.master_key else ''}",
                  f"entries      : {len(ids)}", f"isFenced     : {state.fenced}", f"limbo        : {state.limbo}",
                  f"explicit LAC : {'yes' if state.explicit_lac else 'no'}"]
    expected = ids[0] if ids else 0
    for eid, loc in zip(ids, locations):
        while expected < eid:  # an id missing between two the index holds
            rows.append({"entry_id": expected, "log_id": None, "offset": None})
            lines.append(f"entry {expected}\t:\tN/A")
            expected += 1
        log_id, offset = split_location(loc)
        rows.append({"entry_id": eid, "log_id": log_id, "offset": offset})
        lines.append(f"entry {eid}\t:\t(log: {log_id:x}, pos: {offset})")
        expected = eid + 1
    d = {"ok": True, "ledger_id": lid, "entries": rows, "text": "\n".join(lines)}
    if args.meta:
        d["meta"] = None if state is None else {
            "master_key": state.master_key.hex() if state.master_key else "", "fenced": state.fenced,
            "limbo": state.limbo, "explicit_lac": state.explicit_lac is not None, "entries": len(ids)}
    return d


@command(
    "activeledgers", help="the ledgers with data in one entry log that the metadata store has",
    description="BookKeeper's `activeledgers`: the ledgers of entry log N (its ledgers map, or "
                "a scan) that still exist in the metadata store.",
    args=(arg("-logId", "-l", "--logid", dest="log_id", type=_log_id, required=True,
              help="the entry log's id (decimal as BookKeeper takes it, or 0x... as in the file name)"),
          arg("-timeout", "-t", "--timeout", dest="timeout_ms", type=at_least(1), default=60_000,
              help="ms to list the metadata store's ledgers (default 60000)"),
          *DIR_ARGS))
async def cmd_activeledgers(uri, args):
    from bk.meta import open_store
    from bk.meta.ledger_manager import LedgerManager

    from .shell_gc import _config, _logs, _metadata
    cfg = _config(args)
    found = [p for log_id, p in _logs(cfg) if log_id == args.log_id]
    if not found:
        raise BKError(f"no entry log {args.log_id} ({args.log_id:x}.log) in {', '.join(cfg.ledger_dirs)}")
    meta, report = _metadata(found[0], None)
    store = await open_store(uri)
    try:
        try:
            async with asyncio.timeout(args.timeout_ms / 1000):
                existing = set(await LedgerManager(store).list_ledger_ids())
        except asyncio.TimeoutError:
            raise BKError(f"listing the metadata store's ledgers took over {args.timeout_ms} ms: "
                          "give a longer -timeout") from None
    finally:
        await store.close()
    active = sorted(lid for lid in meta.ledgers if lid in existing)
    gone = sorted(lid for lid in meta.ledgers if lid not in existing)
    lines = ([f"active ledgers on entry log {args.log_id} ({args.log_id:x}.log):", *map(str, active)] if active
             else [f"no active ledgers on entry log {args.log_id} ({args.log_id:x}.log)"])
    if gone:
        lines.append(f"{len(gone)} more ledgers with data there are deleted (GC will reclaim them)")
    if not report.clean:
        lines.append(f"the log's scan stopped: {report.reason} at offset {report.stop_offset} (ledgers after it "
                     "are not listed)")
    return {"ok": True, "log_id": args.log_id, "active": active, "deleted": gone,
            "scan_stopped": None if report.clean else f"{report.reason} at offset {report.stop_offset}",
            "text": "\n".join(lines)}
