"""Per-entry-log usage (BookKeeper's EntryLogMetadata): the one documented format GC,
compaction, `bk shell listfilesondisc` and outside readers (Spark, issue 14) share.

Pure module: standard library and `bk.formats` only (no `bk._native`, no
server, no lmdb), so a job that is handed a bookie's ledger directories can import
it and read every entry log without the bookie running.

What a log's usage is
    total_bytes   bytes of every record in the log, 4-byte size fields included:
                  the sum of its ledgers map (format.py), which is written when the
                  log is closed.
    ledgers       ledger id -> bytes of that ledger's records in the log, for the
                  ledgers still alive (a GC pass removes deleted ledgers).
    live_bytes    sum(ledgers.values())
    usage         live_bytes / total_bytes (1.0 for an empty log, which GC deletes:
                  an empty log has no ledgers left either)
The header (bk.formats.entrylog.LOG_HEADER_BYTES) and the ledgers map itself are not counted: the
figures are what deleting or rewriting the ledgers' records frees or costs.

Where the figures come from (`read_log_metadata`)
    "map"   the closed log's ledgers map, CRC-checked;
    "scan"  the map is missing (the log was never closed: a crash, or it is the
            log a live bookie is writing) or fails its CRC: the records are walked
            from the header on; a torn or garbage tail stops the walk, and what
            was valid before it is counted (`ScanReport` says where and why).
Either way a bad file never raises past `read_log_metadata` except for I/O errors
and a file too short to hold a header.

JSON (`to_dict` / `from_dict`, what the bookie's admin channel and
`bk shell listfilesondisc --json` print for each log):
    {"log_id": int, "file_name": "<hex>.log", "total_bytes": int, "live_bytes": int,
     "usage": float, "source": "map" | "scan" | "memory", "damage": "" | "<why> at offset <n>",
     "ledgers": {"<ledger id>": bytes}}
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterator

from bk.formats import entrylog as fmt
from bk.formats.entry import ENTRY_IDS as _IDS

SCAN_READ_BYTES = 4 * 1024 * 1024
_SIZE = fmt.LOG_SIZE_FIELD


@dataclass
class EntryLogMetadata:
    log_id: int
    total_bytes: int = 0
    ledgers: dict[int, int] = field(default_factory=dict)  # live ledger id -> bytes
    source: str = "map"
    # Why and where a scan stopped short ("" when the figures cover the whole log). A
    # damaged log's `ledgers` are only those seen before the damage: never proof that a
    # ledger is absent from it (GC asks the index, bk.bookie.gc).
    damage: str = ""

    @classmethod
    def from_ledgers_map(cls, log_id: int, usage: dict[int, int], source: str = "map") -> "EntryLogMetadata":
        return cls(log_id, sum(usage.values()), dict(usage), source)

    @property
    def live_bytes(self) -> int:
        return sum(self.ledgers.values())

    @property
    def usage(self) -> float:
        return self.live_bytes / self.total_bytes if self.total_bytes else 1.0

    @property
    def damaged(self) -> bool:
        return bool(self.damage)

    def is_empty(self) -> bool:
        """No live ledger left: the whole log can go (never true of a damaged log:
        what lies past its damage is unknown to these figures)."""
        return not self.ledgers and not self.damage

    def remove_ledger(self, ledger_id: int) -> int:
        """Forget a deleted ledger; returns the bytes it held here."""
        return self.ledgers.pop(ledger_id, 0)

    def remove_ledgers_if(self, dead) -> list[int]:
        """Forget every ledger for which dead(ledger_id) is true; returns their ids."""
        gone = [lid for lid in self.ledgers if dead(lid)]
        for lid in gone:
            del self.ledgers[lid]
        return gone

    def to_dict(self, with_ledgers: bool = True) -> dict:
        out = {"log_id": self.log_id, "file_name": fmt.log_file_name(self.log_id),
               "total_bytes": self.total_bytes, "live_bytes": self.live_bytes,
               "usage": round(self.usage, 6), "source": self.source, "damage": self.damage}
        if with_ledgers:
            out["ledgers"] = {str(lid): n for lid, n in sorted(self.ledgers.items())}
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "EntryLogMetadata":
        ledgers = {int(k): int(v) for k, v in d.get("ledgers", {}).items()}
        return cls(int(d["log_id"]), int(d["total_bytes"]), ledgers, str(d.get("source", "map")),
                   str(d.get("damage", "")))


@dataclass
class ScanReport:
    """How a scan of a log ended: `clean` when the records ran to their end exactly."""
    records: int = 0
    stop_offset: int = 0
    clean: bool = True
    reason: str = ""  # "torn tail", "bad size <n>", "" when clean


def list_entry_logs(ledger_dir: str) -> list[tuple[int, str]]:
    """(log id, path) of every entry log of one ledger dir, by id."""
    d = fmt.log_dir(ledger_dir)
    out = []
    for name in os.listdir(d) if os.path.isdir(d) else ():
        log_id = fmt.parse_log_file_name(name)
        if log_id is not None:
            out.append((log_id, os.path.join(d, name)))
    return sorted(out)


def read_header(path: str) -> tuple[fmt.LogHeader | None, int]:
    """(header or None when it is unreadable, file size)."""
    with open(path, "rb") as fh:
        head = fh.read(fmt.LOG_HEADER_BYTES)
        size = os.fstat(fh.fileno()).st_size
    try:
        return fmt.decode_header(head), size
    except fmt.HeaderError:
        return None, size


def read_ledgers_map(path: str) -> dict[int, int] | None:
    """The closed log's stored ledgers map, or None when it has none or it is corrupt."""
    header, size = read_header(path)
    # a map the file cannot hold (a corrupt count) is no map: never read (allocate) by its count
    if header is None or not header.map_offset or header.map_offset + fmt.ledgers_map_bytes(header.map_count) > size:
        return None
    with open(path, "rb") as fh:
        fh.seek(header.map_offset)
        raw = fh.read(fmt.ledgers_map_bytes(header.map_count))
    try:
        return fmt.decode_ledgers_map(raw, header.map_count)
    except ValueError:
        return None


def iter_records(path: str, max_entry_bytes: int = 0xFFFFFFFF, report: ScanReport | None = None,
                 chunk_bytes: int = SCAN_READ_BYTES) -> Iterator[tuple[int, memoryview]]:
    """(offset, entry bytes) of each whole record, from the header to the ledgers map
    (closed log) or the end of the file; stops at a torn or garbage record and notes it
    in `report`. Reads `chunk_bytes` at a time; each entry is a view into the current
    chunk, valid until the next iteration. A pure-Python walk, for readers outside the
    bookie (the bookie scans with its kernel, bk.entrylog.files.LogScan)."""
    report = report if report is not None else ScanReport()
    header, file_size = read_header(path)
    mapped = header is not None and 0 < header.map_offset <= file_size
    end = header.map_offset if mapped else file_size
    pos = report.stop_offset = fmt.LOG_HEADER_BYTES
    if end < pos:
        report.clean, report.reason = end == 0, "" if end == 0 else "torn header"
        return
    head_bytes = fmt.LOG_RECORD_HEAD_BYTES
    buf, view, base = b"", memoryview(b""), pos  # buf holds the file's bytes [base, base + len(buf))
    with open(path, "rb", buffering=0) as fh:
        if hasattr(os, "posix_fadvise"):  # a front-to-back read: ask for the larger readahead
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while pos < end:
            rel = pos - base
            if len(buf) - rel < head_bytes:
                fh.seek(pos)
                buf, base, rel = fh.read(min(chunk_bytes, end - pos)), pos, 0
                view = memoryview(buf)
            avail = len(buf) - rel
            size = _SIZE.unpack_from(buf, rel)[0] if avail >= fmt.LOG_SIZE_FIELD_BYTES else -1
            if size < 0 or (fmt.LOG_MIN_ENTRY_BYTES <= size <= max_entry_bytes and
                            (pos + fmt.LOG_SIZE_FIELD_BYTES + size > end or avail < head_bytes)):
                report.clean, report.reason = False, "torn tail"
                return
            if not fmt.LOG_MIN_ENTRY_BYTES <= size <= max_entry_bytes:
                report.clean, report.reason = False, f"bad size {size}"
                return
            record_bytes = fmt.LOG_SIZE_FIELD_BYTES + size
            if avail < record_bytes:  # the record runs past this chunk: read it whole
                fh.seek(pos)
                buf, base, rel = fh.read(min(max(chunk_bytes, record_bytes), end - pos)), pos, 0
                view = memoryview(buf)
                if len(buf) < record_bytes:  # the file shrank under us
                    report.clean, report.reason = False, "torn tail"
                    return
            report.records += 1
            yield pos, view[rel + fmt.LOG_SIZE_FIELD_BYTES: rel + record_bytes]
            pos += record_bytes
            report.stop_offset = pos


def scan_records(path: str, max_entry_bytes: int = 0xFFFFFFFF,
                 report: ScanReport | None = None) -> Iterator[tuple[int, int, int, int]]:
    """(ledger_id, entry_id, offset, size) of each whole record (iter_records' walk)."""
    for pos, entry in iter_records(path, max_entry_bytes, report):
        lid, eid = _IDS.unpack_from(entry)
        yield lid, eid, pos, len(entry)


def scan_ledgers_map(path: str, report: ScanReport | None = None) -> dict[int, int]:
    """A ledgers map rebuilt by walking the records (size fields counted, as the stored map)."""
    usage: dict[int, int] = {}
    for lid, _eid, _off, size in scan_records(path, report=report):
        usage[lid] = usage.get(lid, 0) + fmt.LOG_SIZE_FIELD_BYTES + size
    return usage


def read_log_metadata(path: str, report: ScanReport | None = None) -> EntryLogMetadata:
    """A log's usage from its ledgers map, or rebuilt by a scan when that is missing or
    corrupt (then `source` is "scan", and `damage` says where a walk that did not end
    clean stopped). Every ledger in it counts as live."""
    log_id = fmt.parse_log_file_name(os.path.basename(path))
    header, _ = read_header(path)
    if log_id is None:
        if header is None:
            raise ValueError(f"{path} is neither named nor shaped like an entry log")
        log_id = header.log_id
    stored = read_ledgers_map(path)
    if stored is not None:
        return EntryLogMetadata.from_ledgers_map(log_id, stored, "map")
    report = report if report is not None else ScanReport()
    meta = EntryLogMetadata.from_ledgers_map(log_id, scan_ledgers_map(path, report), "scan")
    if not report.clean:
        meta.damage = f"{report.reason} at offset {report.stop_offset}"
    elif header is not None and header.map_offset:  # the walk stopped at a suspect offset (EntryLogger.log_metadata)
        meta.damage = f"ledgers map unusable at offset {header.map_offset}"
    return meta


def log_usage_row(path: str) -> dict:
    """One log's usage for readers outside the bookie (bk analytics, the HTTP endpoint
    /api/v1/bookie/entry_log_usage), never raising for a bad file:
        {"log_id", "total_bytes", "file_bytes", "source": "map" | "scan" | "error",
         "closed": has a valid ledgers map, "scan_status": "" or why a walk stopped
         ("torn tail", "bad size <n>") or the error, "invalid_bytes": bytes after the
         point a walk stopped, "ledgers": {"<ledger id>": bytes}}.
    Every ledger in the file counts (this reads files, not the bookie's index)."""
    report = ScanReport()
    log_id = fmt.parse_log_file_name(os.path.basename(path))
    try:
        file_bytes = os.path.getsize(path)
        meta = read_log_metadata(path, report)
    except (OSError, ValueError) as e:
        return {"log_id": log_id, "total_bytes": 0, "file_bytes": 0, "source": "error", "closed": False,
                "scan_status": f"{type(e).__name__}: {e}", "invalid_bytes": 0, "ledgers": {}}
    invalid = 0
    if meta.source == "scan" and not report.clean:
        header, size = read_header(path)
        end = header.map_offset if header is not None and 0 < header.map_offset <= size else size
        invalid = max(0, end - report.stop_offset)
    return {"log_id": meta.log_id, "total_bytes": meta.total_bytes, "file_bytes": file_bytes,
            "source": meta.source, "closed": meta.source == "map", "scan_status": report.reason,
            "invalid_bytes": invalid, "ledgers": {str(lid): n for lid, n in sorted(meta.ledgers.items())}}


def entry_log_usage_rows(ledger_dir: str) -> list[dict]:
    """log_usage_row of every entry log of one ledger dir, by log id."""
    return [log_usage_row(path) for _log_id, path in list_entry_logs(ledger_dir)]
