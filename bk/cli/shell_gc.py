"""`bk shell` commands for garbage collection and compaction (declared with @command).

    listfilesondisc [--ledger-dirs DIR ...] [--index-dir DIR]     entry logs from the files
    listfilesondisc -txn|-log|-idx [--journal-dirs DIR ...]       BookKeeper's: paths of those files
    readlogmetadata LOG [--ledger-dirs DIR ...] [--index-dir DIR]  one log's ledgers
    triggergc [--force-major] [--force-minor] [--socket PATH]      run a GC pass on a running bookie
    gcstatus [--socket PATH]                                       its last pass and totals

The first two read the bookie's directories only (no metadata store, the bookie may
be running or not): sizes come from each log's ledgers map (or a scan when it has
none), and "live" from the bookie's own index (a ledger counts as live while the
bookie still has it: GC has not collected it). triggergc and gcstatus talk to the
running bookie through its admin socket (docs/GC.md). Directories and the socket
come from the options, else from `bk shell --conf bookie.toml`. Every command takes
--json (before or after the command name).
"""
from __future__ import annotations

import os
import time

from bk.errors import BKError, ConfigError

from .commands import arg, command_table


COMMANDS, command = command_table()
# an unreadable file or a malformed one is the command's clear error, as a BKError is
ERRORS = (OSError, ValueError)
LOCAL_ARGS = (arg("--ledger-dirs", nargs="+", metavar="DIR", help="the bookie's ledger dirs"),
              arg("--index-dir", metavar="DIR", help="its index dir (default: as the bookie)"))
SOCKET_ARGS = (arg("--socket", metavar="PATH",
                   help="the bookie's admin socket (default: <first ledger dir>/admin.sock)"),
               arg("--ledger-dirs", nargs="+", metavar="DIR", help="find the socket from these"),
               arg("--timeout", type=float, default=3600.0, help="seconds to wait (default 3600)"))


# ---------------------------------------------------------------- local files
def _config(args):
    from bk.config import load_config
    overrides = {}
    if getattr(args, "ledger_dirs", None):
        overrides["ledger_dirs"] = list(args.ledger_dirs)
    if getattr(args, "index_dir", None):
        overrides["index_dir"] = args.index_dir
    if not args.conf and not overrides.get("ledger_dirs"):
        raise ConfigError("which bookie? give --ledger-dirs DIR ... or `bk shell --conf bookie.toml`")
    cfg = load_config(args.conf, overrides=overrides)
    missing = [d for d in cfg.ledger_dirs if not os.path.isdir(d)]
    if missing:
        raise ConfigError(f"no such ledger dir: {', '.join(missing)}")
    return cfg


def _live_ledgers(cfg) -> tuple[set[int] | None, str]:
    """The ledgers the bookie still has (its index, opened read-only), or None."""
    from bk.index import Index
    path = cfg.resolved_index_dir
    if not os.path.exists(os.path.join(path, "data.mdb")):
        return None, "no index found: every ledger in a map counts as live"
    idx = Index(path, cfg, readonly=True)
    try:
        return {lid for lid, _ in idx.ledgers()}, f"live = ledgers in the bookie's index ({path})"
    finally:
        idx.close()


def _logs(cfg):
    from bk.entrylog.usage import list_entry_logs
    return sorted((log_id, path) for d in cfg.ledger_dirs for log_id, path in list_entry_logs(d))


def _metadata(path: str, live: set[int] | None):
    from bk.entrylog.usage import ScanReport, read_log_metadata
    report = ScanReport()
    meta = read_log_metadata(path, report)
    if live is not None:
        meta.remove_ledgers_if(lambda lid: lid not in live)
    return meta, report


def _indexed_entries(cfg, log_ids) -> dict[int, int]:
    """How many entries the bookie's index (read-only) places in each of these logs."""
    from bk.index import Index
    path = cfg.resolved_index_dir
    if not log_ids or not os.path.exists(os.path.join(path, "data.mdb")):
        return {}
    idx = Index(path, cfg, readonly=True)
    try:
        return idx.count_locations_in_logs(log_ids)
    finally:
        idx.close()


def _file_lists(args, cfg) -> dict:
    """BookKeeper's listfilesondisc -txn/-log/-idx: the files' real paths, sorted, per kind."""
    from bk.journal.records import list_files
    kinds = {}
    if args.list_journal:
        dirs = args.journal_dirs or list(cfg.journal_dirs)
        kinds["journal"] = sorted(os.path.realpath(p) for d in dirs for _, p in list_files(d))
    if args.list_entrylog:
        kinds["entrylog"] = sorted(os.path.realpath(p) for _, p in _logs(cfg))
    if args.list_index:
        d = cfg.resolved_index_dir
        kinds["index"] = sorted(os.path.realpath(os.path.join(d, n)) for n in (os.listdir(d) if os.path.isdir(d)
                                                                                else ()))
    titles = {"journal": "Journal Files", "entrylog": "EntryLog Files", "index": "Index Files"}
    lines = []
    for kind, paths in kinds.items():
        lines += [f"--------- {titles[kind]} ---------", *paths, ""]
    return {"ok": True, **{f"{k}_files": v for k, v in kinds.items()}, "text": "\n".join(lines).rstrip()}


@command("listfilesondisc", local=True, errors=ERRORS,
         help="list a bookie's entry logs: total and live bytes, usage",
         description="Without a switch: every entry log with its total and live bytes. With "
                     "BookKeeper's switches: the paths of the journal files (-txn), entry logs "
                     "(-log) and index files (-idx), sorted, each kind under its heading.",
         args=(arg("-txn", "--journal", dest="list_journal", action="store_true", help="list the journal files"),
               arg("-log", "--entrylog", dest="list_entrylog", action="store_true", help="list the entry log files"),
               arg("-idx", "--index", dest="list_index", action="store_true", help="list the index files"),
               arg("--journal-dirs", nargs="+", metavar="DIR", help="the bookie's journal dirs (for -txn)"),
               *LOCAL_ARGS))
def listfilesondisc(uri, args) -> dict:
    cfg = _config(args)
    if args.list_journal or args.list_entrylog or args.list_index:
        return _file_lists(args, cfg)
    live, basis = _live_ledgers(cfg)
    rows = []
    for log_id, path in _logs(cfg):
        meta, report = _metadata(path, live)
        row = meta.to_dict(with_ledgers=False)
        row.update(path=path, file_bytes=os.path.getsize(path), ledger_count=len(meta.ledgers))
        if not report.clean:
            row["scan_stopped"] = f"{report.reason} at offset {report.stop_offset}"
        rows.append(row)
    # A damaged log's figures cover only what lies before the damage: the index says
    # what else is live in it (GC keeps the log while the index places anything there).
    indexed = _indexed_entries(cfg, [r["log_id"] for r in rows if r["damage"]])
    for r in rows:
        if r["log_id"] in indexed:
            r["indexed_entries"] = indexed[r["log_id"]]
    damaged = [r for r in rows if r["damage"]]
    total = sum(r["total_bytes"] for r in rows)
    live_bytes = sum(r["live_bytes"] for r in rows)
    lines = [f"{'log':>8} {'file bytes':>12} {'total bytes':>12} {'live bytes':>12} {'usage':>6} {'ledgers':>7}  source",
             *(f"{r['log_id']:>8x} {r['file_bytes']:>12} {r['total_bytes']:>12} {r['live_bytes']:>12} "
               f"{r['usage']:>6.2f} {r['ledger_count']:>7}  {r['source']}"
               + (f" DAMAGED ({r['damage']}; the index places {r.get('indexed_entries', '?')} entries here)"
                  if r["damage"] else "") for r in rows),
             f"{len(rows)} entry logs, {total} bytes of records, {live_bytes} live "
             f"({live_bytes / total:.0%})" if total else f"{len(rows)} entry logs, no records", basis]
    if damaged:
        lines.append(f"{len(damaged)} damaged entry logs: their figures stop at the damage; GC keeps each "
                     "until the index places nothing in it")
    return {"ok": True, "entry_logs": rows, "total_bytes": total, "live_bytes": live_bytes,
            "damaged_logs": len(damaged), "live_basis": basis, "text": "\n".join(lines)}


@command("readlogmetadata", local=True, errors=ERRORS, help="one entry log's ledgers and their bytes",
         args=(arg("log", help="log id (hex, as in the file name) or the log file's path"), *LOCAL_ARGS))
def readlogmetadata(uri, args) -> dict:
    from bk.formats import entrylog as fmt
    path = args.log
    if os.path.sep in path or path.endswith(fmt.LOG_SUFFIX):
        cfg = _config(args) if (args.conf or args.ledger_dirs) else None
    else:
        cfg = _config(args)
        try:
            log_id = int(path, 16)
        except ValueError:
            raise ValueError(f"{args.log!r} is neither a hex log id nor a path") from None
        found = [p for lid, p in _logs(cfg) if lid == log_id]
        if not found:
            raise ValueError(f"no entry log {log_id:x} in {', '.join(cfg.ledger_dirs)}")
        path = found[0]
    live, basis = _live_ledgers(cfg) if cfg is not None else (None, "no bookie given: every ledger counts as live")
    meta, report = _metadata(path, None)
    d = meta.to_dict()
    d["path"] = path
    d["ledgers"] = [{"ledger_id": lid, "bytes": n, "live": live is None or lid in live}
                    for lid, n in sorted(meta.ledgers.items())]
    d["live_bytes"] = sum(x["bytes"] for x in d["ledgers"] if x["live"])
    d["usage"] = round(d["live_bytes"] / d["total_bytes"], 6) if d["total_bytes"] else 1.0
    d["live_basis"] = basis
    d["scan"] = None if report.clean else f"{report.reason} at offset {report.stop_offset}"
    lines = [f"entry log {meta.log_id:x} ({path}): {d['total_bytes']} bytes of records, {d['live_bytes']} live, "
             f"usage {d['usage']:.2f}, from its {'ledgers map' if meta.source == 'map' else 'records (scan)'}",
             *(f"  ledger {x['ledger_id']:>12} {x['bytes']:>12} bytes{'' if x['live'] else '  (deleted)'}"
               for x in d["ledgers"]), basis]
    d["text"] = "\n".join(lines)
    return d


# ---------------------------------------------------------------- running bookie
def _socket(args) -> str:
    if args.socket:
        return args.socket
    if args.ledger_dirs:
        return os.path.join(args.ledger_dirs[0], "admin.sock")
    if args.conf:
        from bk.config import load_config
        return load_config(args.conf).resolved_admin_socket_path
    raise ConfigError("which bookie? give --socket PATH, --ledger-dirs DIR or `bk shell --conf bookie.toml`")


def _call(args, op: str, **kw) -> dict:
    from bk.server.admin import AdminError, admin_call
    try:
        return admin_call(_socket(args), op, timeout_s=args.timeout, **kw)
    except AdminError as e:
        raise BKError(str(e)) from None


def _when(ms) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms else "never"


def _pass_with_progress(args) -> dict:
    """gc_trigger (it answers when the pass is over); on a terminal a tqdm line meanwhile,
    its figures from gc_status polled on a second connection (a failed poll is skipped)."""
    import threading

    from .progress import progress_bar
    done: dict = {}

    def run() -> None:
        try:
            done["out"] = _call(args, "gc_trigger", force_major=args.force_major, force_minor=args.force_minor)
        except BaseException as e:  # handed to the caller's thread
            done["error"] = e
    worker = threading.Thread(target=run, name="triggergc", daemon=True)
    start = time.monotonic()
    worker.start()
    with progress_bar(desc="GC pass", unit="s", quiet=args.json) as bar:
        while worker.is_alive():
            worker.join(0.5)
            if bar.tty and worker.is_alive():
                try:
                    from bk.server.admin import admin_call
                    st = admin_call(_socket(args), "gc_status", timeout_s=2.0)
                    left = st.get("candidates_left")
                    postfix = (f"compacting {st.get('compacting_logs')} logs"
                               + (f", {left} deleted-ledger candidates left" if left is not None else ""))
                except Exception:  # noqa: BLE001 - only the display is lost
                    postfix = None
                bar.update_to(int(time.monotonic() - start), postfix=postfix)
    if "error" in done:
        raise done["error"]
    return done["out"]


@command("triggergc", local=True, errors=ERRORS, help="run a GC pass (and compaction) on a running bookie now",
         args=(arg("--force-major", action="store_true", help="run a major compaction even if not due"),
               arg("--force-minor", action="store_true", help="run a minor compaction even if not due"),
               *SOCKET_ARGS))
def triggergc(uri, args) -> dict:
    out = _pass_with_progress(args)
    lines = [f"GC pass at {_when(out.get('start_ms'))} took {out.get('duration_ms')} ms",
             f"  ledgers deleted   {len(out.get('ledgers_deleted', []))} "
             f"({len(out.get('over_replicated_deleted', []))} over-replicated)",
             f"  logs deleted      {len(out.get('logs_deleted', []))}",
             f"  logs compacted    {len(out.get('logs_compacted', []))} ({out.get('compaction') or 'no compaction'})",
             f"  bytes freed       {out.get('bytes_freed', 0)}",
             f"  bytes rewritten   {out.get('bytes_rewritten', 0)}"]
    lines += [f"  error: {e}" for e in out.get("errors", [])]
    out["text"] = "\n".join(lines)
    return out


def _or_unknown(value):
    return "unknown" if value is None else value


@command("gcstatus", local=True, errors=ERRORS, help="a running bookie's GC: last pass, totals, settings",
         args=SOCKET_ARGS)
def gcstatus(uri, args) -> dict:
    st = _call(args, "gc_status")
    st["ok"] = True
    lines = [f"GC {'running a pass now' if st.get('running') else 'idle'}; last pass {_when(st.get('last_run_start_ms'))}"
             f" ({st.get('last_run_duration_ms')} ms)",
             f"  passes {st.get('passes')}, ledgers deleted {st.get('ledgers_deleted')}, logs deleted "
             f"{st.get('logs_deleted')}, logs compacted {st.get('logs_compacted')}, bytes freed {st.get('bytes_freed')}",
             f"  errors {st.get('errors')}" + (f" (last: {st['last_error']})" if st.get("last_error") else ""),
             f"  entry logs known {st.get('entry_logs')}, compactions to finish {st.get('compacting_logs')}",
             f"  deleted ledgers still to collect (candidates left) {_or_unknown(st.get('candidates_left'))}"]
    lines += [f"  DAMAGED entry log {log_id}: {why} (kept while the index places entries in it)"
              for log_id, why in (st.get("damaged_logs") or {}).items()]
    st["text"] = "\n".join(lines)
    return st
