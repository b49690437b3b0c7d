"""`bk shell` commands that read a bookie's own files: no metadata store needed.

    lastmark                          the journal log marks persisted in the index
    readjournal [FILE_ID] [--ledger L] [--print-msg]     a journal file's records
    readlog LOG_ID|PATH [--ledger L] [--entry E] [--print-msg]   an entry log's records
    localconsistencycheck             every index location against the entry logs

The bookie's directories come from --conf FILE (else the BK_* environment and the
defaults). Every command only reads: a torn journal tail is reported, not cut.
localconsistencycheck is meant for a stopped bookie (its index is read as it is on
disk, and entries still in a running bookie's write cache are not there yet).
"""
from __future__ import annotations

import os

from bk.errors import BKError, IncorrectParameterError

from .commands import arg, command_table

COMMANDS, command = command_table()


def _config(args):
    from bk.config import load_config
    return load_config(args.conf)


def _open_index(cfg):
    from bk.index import Index

    path = cfg.resolved_index_dir
    if not os.path.isdir(path):
        raise BKError(f"no index at {path}: is --conf this bookie's configuration?")
    return Index(path, cfg)


def _payload(entry: bytes) -> str:
    """An entry's payload after its 24-byte header and the digest, as text (best effort)."""
    return bytes(entry).decode("utf-8", errors="backslashreplace")


@command("lastmark", help="the journal log marks persisted in this bookie's index (local files)", local=True)
async def cmd_lastmark(uri, args):
    import asyncio

    cfg = _config(args)

    def read():
        index = _open_index(cfg)
        try:
            return [index.get_log_mark(i) for i in range(len(cfg.journal_dirs))]
        finally:
            index.close()
    marks = await asyncio.to_thread(read)
    rows = [{"journal_dir": d, "log_file_id": m.file_id if m else None, "log_file_offset": m.offset if m else None}
            for d, m in zip(cfg.journal_dirs, marks)]
    text = "\n".join(f"{r['journal_dir']}: " + (f"LastMark: logFileId - {r['log_file_id']:x}, logFileOffset -"
                                                f" {r['log_file_offset']}" if r["log_file_id"] is not None
                                                else "no mark persisted")
                     for r in rows)
    return {"marks": rows, "text": text}


@command("readjournal", help="print a journal file's records (local files)", local=True,
         args=(arg("file_id", nargs="?", default=None, help="journal file id in hex (default: the newest)"),
               arg("--journal-dir", default=None, help="default: the first of journal_dirs"),
               arg("--ledger", type=int, default=None, help="only this ledger's records"),
               arg("--print-msg", action="store_true", help="print each entry's payload")))
async def cmd_readjournal(uri, args):
    import asyncio

    from bk._native import load
    from bk.journal.records import META_IDS, list_files, max_record_bytes
    from bk.journal.replay import scan_journal_file

    cfg = _config(args)
    journal_dir = args.journal_dir or cfg.journal_dirs[0]
    files = list_files(journal_dir)
    if not files:
        raise BKError(f"no journal files in {journal_dir}/current")
    if args.file_id is None:
        file_id, path = files[-1]
    else:
        try:
            wanted = int(args.file_id, 16)
        except ValueError:
            raise IncorrectParameterError(f"journal file id {args.file_id!r} is not hex") from None
        found = [f for f in files if f[0] == wanted]
        if not found:
            raise BKError(f"no journal file {wanted:x}.txn in {journal_dir}/current"
                          f" (there are {', '.join(f'{i:x}' for i, _ in files)})")
        file_id, path = found[0]
    names = {-0x1000: "MASTER_KEY", -0x2000: "FENCE", -0x8000: "EXPLICIT_LAC"}
    rows = []

    def on_record(ledger_id, entry_id, body):
        if args.ledger is not None and ledger_id != args.ledger:
            return
        row = {"ledger_id": ledger_id, "entry_id": entry_id, "size": len(body)}
        if entry_id in META_IDS:
            row["type"] = names.get(entry_id, "META")
        if args.print_msg and entry_id >= 0:
            row["data"] = _payload(body[24:])
        rows.append(row)

    count, end, bad = await asyncio.to_thread(scan_journal_file, path, file_id, on_record, kernel=load("journal"),
                                              max_record_bytes=max_record_bytes(cfg))
    lines = [f"journal file {path}: {count} records, valid data ends at offset {end}"]
    if bad:
        lines.append(f"bad data from {bad} (a torn tail unless later files exist)")
    for r in rows:
        what = r.get("type") or f"entry {r['entry_id']}"
        line = f"ledger {r['ledger_id']} {what} ({r['size']} bytes)"
        if "data" in r:
            line += f": {r['data']}"
        lines.append(line)
    return {"journal_file": path, "file_id": file_id, "records": count, "end_offset": end, "bad_data_at": bad,
            "rows": rows, "text": "\n".join(lines)}


def _log_path(cfg, log: str) -> tuple[int, str]:
    from bk.formats.entrylog import log_dir, log_file_name, parse_log_file_name

    if os.sep in log or log.endswith(".log"):
        log_id = parse_log_file_name(os.path.basename(log))
        if log_id is None or not os.path.isfile(log):
            raise BKError(f"{log} is not an entry log file (<hex id>.log)")
        return log_id, log
    try:
        log_id = int(log, 16)
    except ValueError:
        raise IncorrectParameterError(f"entry log id {log!r} is not hex") from None
    for d in cfg.ledger_dirs:
        path = os.path.join(log_dir(d), log_file_name(log_id))
        if os.path.isfile(path):
            return log_id, path
    raise BKError(f"no entry log {log_id:x} in {', '.join(cfg.ledger_dirs)}")


def scan_log_file(cfg, log_id: int, path: str):
    """A LogScan over one entry log file, up to its ledgers map (closed) or its end (open)."""
    from bk._native import load
    from bk.entrylog.files import LogScan
    from bk.formats.entrylog import LOG_HEADER_BYTES, decode_header

    with open(path, "rb") as fh:
        head = fh.read(LOG_HEADER_BYTES)
    size = os.path.getsize(path)
    end = size
    if len(head) == LOG_HEADER_BYTES:
        header = decode_header(head)
        if header.map_offset:
            end = min(header.map_offset, size)
    return LogScan(load("entrylog"), path, log_id, end, cfg.max_frame_size_bytes)


@command("readlog", help="print an entry log's records (local files)", local=True,
         args=(arg("log", help="entry log id in hex, or a path to a .log file"),
               arg("--ledger", type=int, default=None, help="only this ledger's records"),
               arg("--entry", type=int, default=None, help="only this entry id (with --ledger)"),
               arg("--print-msg", action="store_true", help="print each entry's payload")))
async def cmd_readlog(uri, args):
    import asyncio

    from bk.entrylog.files import SCAN_CLEAN
    from bk.formats.entrylog import split_location

    cfg = _config(args)
    log_id, path = _log_path(cfg, args.log)
    if args.entry is not None and args.ledger is None:
        raise IncorrectParameterError("--entry needs --ledger")

    def read():
        scan = scan_log_file(cfg, log_id, path)
        rows, total = [], 0
        with open(path, "rb") as fh:
            for ledger_id, entry_id, location, size in scan:
                total += 1
                if args.ledger is not None and ledger_id != args.ledger:
                    continue
                if args.entry is not None and entry_id != args.entry:
                    continue
                row = {"ledger_id": ledger_id, "entry_id": entry_id, "offset": split_location(location)[1],
                       "size": size}
                if args.print_msg:
                    fh.seek(row["offset"] + 4)
                    row["data"] = _payload(fh.read(size)[24:])
                rows.append(row)
        return rows, total, scan.status, scan.stop_offset
    rows, total, status, stop = await asyncio.to_thread(read)
    lines = [f"entry log {path} (id {log_id:x}): {total} records"
             + ("" if status == SCAN_CLEAN else f"; bad or torn data at offset {stop}")]
    for r in rows:
        line = f"ledger {r['ledger_id']} entry {r['entry_id']} at offset {r['offset']} ({r['size']} bytes)"
        if "data" in r:
            line += f": {r['data']}"
        lines.append(line)
    return {"entry_log": path, "log_id": log_id, "records": total, "clean": status == SCAN_CLEAN,
            "bad_data_at": None if status == SCAN_CLEAN else stop, "rows": rows, "text": "\n".join(lines)}


def consistency_check(cfg) -> dict:
    """Every index location must name a record of its ledger and entry in an entry log."""
    from bk.formats.entrylog import log_dir, log_file_name, split_location

    index = _open_index(cfg)
    problems, checked = [], 0
    by_log: dict[int, dict] = {}  # log id -> {offset: (ledger, entry)} from one scan each
    paths = {}
    for d in cfg.ledger_dirs:
        for name in os.listdir(log_dir(d)) if os.path.isdir(log_dir(d)) else ():
            if name.endswith(".log"):
                try:
                    paths[int(name[:-4], 16)] = os.path.join(log_dir(d), name)
                except ValueError:
                    pass
    try:
        for ledger_id, entry_id, location in index.iter_locations():
            checked += 1
            log_id, offset = split_location(location)
            if log_id not in by_log:
                if log_id not in paths:
                    by_log[log_id] = None
                else:
                    by_log[log_id] = {split_location(loc)[1]: (lid, eid)
                                      for lid, eid, loc, _ in scan_log_file(cfg, log_id, paths[log_id])}
            records = by_log[log_id]
            if records is None:
                problems.append({"ledger_id": ledger_id, "entry_id": entry_id, "location": location,
                                 "problem": f"entry log {log_file_name(log_id)} is missing"})
            elif records.get(offset) != (ledger_id, entry_id):
                found = records.get(offset)
                problems.append({"ledger_id": ledger_id, "entry_id": entry_id, "location": location,
                                 "problem": f"no record at offset {offset} of {log_file_name(log_id)}" if found is None
                                 else f"the record at offset {offset} of {log_file_name(log_id)} is ledger"
                                      f" {found[0]} entry {found[1]}"})
    finally:
        index.close()
    return {"ok": not problems, "locations_checked": checked, "entry_logs": len(paths), "problems": problems}


@command("localconsistencycheck", local=True,
         help="check every index location against the entry logs (a stopped bookie's files)")
async def cmd_localconsistencycheck(uri, args):
    import asyncio

    cfg = _config(args)
    result = await asyncio.to_thread(consistency_check, cfg)
    lines = [f"checked {result['locations_checked']} index locations against {result['entry_logs']} entry logs:"
             f" {'consistent' if result['ok'] else str(len(result['problems'])) + ' problem(s)'}"]
    lines += [f"ledger {p['ledger_id']} entry {p['entry_id']}: {p['problem']}" for p in result["problems"][:100]]
    result["text"] = "\n".join(lines)
    return result
