"""Reading one bookie's entry logs into Arrow batches (the work of one Spark task).

Two modes, each a table (schemas below, one source of truth for the data sources,
the remote rows and the job):

- ledgers map (`LEDGERS_SCHEMA`): one row per (log, ledger) with the ledger's bytes in
  the log, 4-byte size fields included (bk.entrylog.usage). From the closed log's
  ledgers map, or, when it has none (a log a live bookie is writing, a crash) or it
  fails its CRC, from a walk of the records (`source` = "scan"; a torn or garbage
  tail ends the walk and `invalid_bytes` counts what follows). A log with no
  ledger at all has one row with a null ledger id and 0 bytes; a log that cannot be
  read has one row with `source` = "error". Nothing here raises for a bad file.
- full scan (`ENTRIES_SCHEMA`): one row per record: ledger, entry id, offset, size,
  and whether the entry's digest checks (`checksum` names the digest that matched;
  null `checksum_valid` = cannot be checked: MAC needs the ledger's password, DUMMY
  has none); a torn or garbage tail is one more row with `status` saying why, a
  null ledger id and `size` = the bytes from there to the end.

Bytes: record bytes = 4 (size field) + entry bytes; entry bytes = 32 (header:
ledger, entry, LAC, length) + digest (CRC32C 4, CRC32 8, MAC 20, DUMMY 0) + payload.
"""
from __future__ import annotations

import glob
import os

import pyarrow as pa

from bk.entrylog import usage
from bk.formats.entry import ENTRY_IDS as _IDS, DigestType, entry_crc_matches

BATCH_ROWS = 65536

LEDGERS_SCHEMA = pa.schema([
    ("bookie_id", pa.string()), ("ledger_dir", pa.string()), ("log_id", pa.int64()),
    ("ledger_id", pa.int64()), ("bytes", pa.int64()), ("log_total_bytes", pa.int64()),
    ("file_bytes", pa.int64()), ("source", pa.string()), ("closed", pa.bool_()),
    ("scan_status", pa.string()), ("invalid_bytes", pa.int64()),
])
ENTRIES_SCHEMA = pa.schema([
    ("bookie_id", pa.string()), ("log_id", pa.int64()), ("ledger_id", pa.int64()), ("entry_id", pa.int64()),
    ("offset", pa.int64()), ("size", pa.int64()), ("checksum", pa.string()), ("checksum_valid", pa.bool_()),
    ("status", pa.string()),
])


def spark_ddl(schema: pa.Schema) -> str:
    """The Arrow schema as Spark DDL (the data sources declare their schema with it)."""
    names = {pa.string(): "string", pa.int64(): "bigint", pa.bool_(): "boolean", pa.float64(): "double"}
    return ", ".join(f"`{f.name}` {names[f.type]}" for f in schema)


# ---------------------------------------------------------------- which logs
def bookie_id_of(ledger_dir: str) -> str:
    """The bookie id from the directory's cookie (current/VERSION); without a readable
    cookie, `unknown:<dir>` so its bytes still count and the report says so. (bk.meta's
    cookie format needs protobuf: imported here, on the driver, never on an executor.)"""
    from bk.meta.cookie import read_directory_cookie

    try:
        cookie = read_directory_cookie(ledger_dir)
    except Exception:  # noqa: BLE001 - a malformed cookie is reported, not fatal
        cookie = None
    return cookie.bookie_host if cookie is not None else f"unknown:{os.path.abspath(ledger_dir)}"


def expand_dirs(patterns) -> list[str]:
    """Ledger dirs from paths or globs (`/data/bookie-*/ledgers`); ValueError when one matches nothing."""
    out = []
    for pattern in patterns:
        found = sorted(glob.glob(pattern)) if any(c in pattern for c in "*?[") else [pattern]
        found = [d for d in found if os.path.isdir(d)]
        if not found:
            raise ValueError(f"no ledger directory at {pattern}")
        out += [os.path.abspath(d) for d in found if os.path.abspath(d) not in out]
    return out


def list_logs(ledger_dirs) -> list[tuple[str, str, int, str]]:
    """(bookie id, ledger dir, log id, path) of every entry log under the dirs."""
    out = []
    for d in ledger_dirs:
        bookie_id = bookie_id_of(d)
        out += [(bookie_id, d, log_id, path) for log_id, path in usage.list_entry_logs(d)]
    return out


# ---------------------------------------------------------------- ledgers-map rows
def usage_to_batch(bookie_id: str, ledger_dir: str, logs: list[dict]) -> pa.RecordBatch:
    """LEDGERS_SCHEMA rows of usage dicts (bk.entrylog.usage.log_usage_row, also what the HTTP endpoint answers)."""
    cols: dict[str, list] = {f.name: [] for f in LEDGERS_SCHEMA}
    for u in logs:
        ledgers = u["ledgers"] or {None: 0}
        for ledger_id, n in ledgers.items():
            cols["bookie_id"].append(bookie_id)
            cols["ledger_dir"].append(ledger_dir)
            cols["log_id"].append(u["log_id"])
            cols["ledger_id"].append(None if ledger_id is None else int(ledger_id))
            cols["bytes"].append(int(n))
            cols["log_total_bytes"].append(u["total_bytes"])
            cols["file_bytes"].append(u["file_bytes"])
            cols["source"].append(u["source"])
            cols["closed"].append(u["closed"])
            cols["scan_status"].append(u["scan_status"])
            cols["invalid_bytes"].append(u["invalid_bytes"])
    return pa.RecordBatch.from_pydict(cols, schema=LEDGERS_SCHEMA)


# ---------------------------------------------------------------- full scan
_CRCS = (DigestType.CRC32C, DigestType.CRC32)


def check_digest(entry, digest_type: DigestType | None) -> tuple[str | None, bool | None]:
    """(digest that matched or was checked, valid?) of one digest-framed entry.
    Known type: CRC32C/CRC32 are checked; MAC (needs the password) and DUMMY give None.
    Unknown type (a deleted ledger): CRC32C then CRC32 are tried; neither matching
    reads as (None, None): perhaps MAC, perhaps corrupt, not decidable here."""
    if digest_type is not None:
        if digest_type not in _CRCS:
            return digest_type.name.lower(), None
        return digest_type.name.lower(), bool(entry_crc_matches(entry, digest_type))  # short: False
    for kind in _CRCS:
        if entry_crc_matches(entry, kind):
            return kind.name.lower(), True
    return None, None


def scan_batches(bookie_id: str, log_id: int, path: str, digest_types: dict | None = None,
                 checksums: bool = True):
    """ENTRIES_SCHEMA batches of one log; never raises for a bad file."""
    digest_types = digest_types or {}
    cols: dict[str, list] = {f.name: [] for f in ENTRIES_SCHEMA}
    lids, eids, offs, sizes, kinds, valid = (cols["ledger_id"], cols["entry_id"], cols["offset"], cols["size"],
                                             cols["checksum"], cols["checksum_valid"])

    def flush():
        n = len(lids)
        cols["bookie_id"] = [bookie_id] * n
        cols["log_id"] = [log_id] * n
        cols["status"] += ["ok"] * (n - len(cols["status"]))
        return pa.RecordBatch.from_pydict(cols, schema=ENTRIES_SCHEMA)

    report = usage.ScanReport()
    try:
        for pos, entry in usage.iter_records(path, report=report):
            lid, eid = _IDS.unpack_from(entry)
            kind, ok = check_digest(entry, digest_types.get(lid)) if checksums else (None, None)
            lids.append(lid)
            eids.append(eid)
            offs.append(pos)
            sizes.append(len(entry))
            kinds.append(kind)
            valid.append(ok)
            if len(lids) >= BATCH_ROWS:
                yield flush()
                cols = {f.name: [] for f in ENTRIES_SCHEMA}
                lids, eids, offs, sizes, kinds, valid = (cols["ledger_id"], cols["entry_id"], cols["offset"],
                                                         cols["size"], cols["checksum"], cols["checksum_valid"])
        if not report.clean:
            header, size = usage.read_header(path)
            end = header.map_offset if header is not None and 0 < header.map_offset <= size else size
            _bad_row(cols, report.stop_offset, end - report.stop_offset, report.reason)
    except OSError as e:
        _bad_row(cols, report.stop_offset, 0, f"error: {e.strerror or e}")
    if lids:
        yield flush()


def _bad_row(cols: dict, offset: int, size: int, status: str) -> None:
    cols["status"] += ["ok"] * (len(cols["ledger_id"]) - len(cols["status"]))
    for name, value in (("ledger_id", None), ("entry_id", None), ("offset", offset), ("size", max(0, size)),
                        ("checksum", None), ("checksum_valid", False), ("status", status)):
        cols[name].append(value)
