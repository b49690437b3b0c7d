"""Fuzz targets of the bookie's on-disk readers: journal records, entry logs and ledgers maps,
LMDB index records. The bytes play a file (or index records) a crash, a bad disk or a bad
copy left behind; the readers' contract (STORAGE.md) is a result or StorageError (most often
CorruptedStorageError naming path and offset), never another exception, and never an
allocation sized by a field of the file rather than by the file itself.

Files go to one scratch directory per process (on /dev/shm when there is one: the readers
fsync when they cut a torn tail).
"""
from __future__ import annotations

import atexit
import os
import shutil
import struct
import tempfile

from bk.config import load_config
from bk.formats import entrylog as efmt
from bk.formats.index import LOCATION_RECORD_BYTES
from bk.entrylog.logger import EntryLogger
from bk.errors import StorageError
from bk.index import state as ist
from bk.index.index import Index
from bk.journal import records as jrec
from bk.journal.replay import replay_journal, scan_journal_file
from bk.journal.records import LogMark

from .contract import Twins, allowed, check, params, plain

_journal = Twins("journal")
_entrylog = Twins("entrylog")
_index = Twins("index")
_scratch_dir: str | None = None
SCRATCH_ENV = "BK_FUZZ_SCRATCH"


def shm_dir() -> str | None:
    """/dev/shm when writable (the readers fsync when they cut a torn tail), else the default."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def scratch(name: str) -> str:
    """A fresh empty directory `name` under this process's scratch dir."""
    global _scratch_dir
    if _scratch_dir is None:
        # a fuzzing child ends in libFuzzer's exit(), which runs no atexit: its parent made
        # (and removes) the directory named by BK_FUZZ_SCRATCH
        _scratch_dir = os.environ.get(SCRATCH_ENV) or tempfile.mkdtemp(prefix="bk-fuzz-", dir=shm_dir())
        if SCRATCH_ENV not in os.environ:
            atexit.register(shutil.rmtree, _scratch_dir, True)
    path = os.path.join(_scratch_dir, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def _write(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


_MAX_RECORDS = (1, 16, 64, 1024, 1 << 20, 0x7FFFFFFF, 24, 100)


# ---------------------------------------------------------------- journal
def journal(data: bytes) -> None:
    p, buf = params(data, 2)
    max_rec = _MAX_RECORDS[p[0] & 7]
    found, stop, status = _journal.same("scan_records", buf, 0, len(buf), max_rec, normalize=plain)
    pos = 0
    for off, ln in found:  # contiguous, in range, CRC-checked
        check(off == pos + 8 and 0 < ln <= max_rec, "journal scan: records not contiguous")
        check(_journal.same("crc32c", buf[off:off + ln]) == int.from_bytes(buf[off - 4:off], "big"), "bad CRC taken")
        pos = off + ln
    check(stop == pos and (status == 0) == (stop == len(buf)), f"journal scan stop {stop} status {status}")
    _journal.same("find_valid_record", buf, p[1] % (len(buf) + 1), len(buf), max_rec)
    # file level: the records after a valid header (p[1] odd: the bytes are the whole file)
    d = scratch("journal")
    content = buf if p[1] & 1 else jrec.encode_header(0) + buf
    path = jrec.file_path(d, 0)
    _write(path, content)
    seen = []
    with allowed(StorageError):
        scan_journal_file(path, 0, lambda lid, eid, body: seen.append(bytes(body)), kernel=_journal.pure,
                          max_record_bytes=max_rec)
    replayed = []
    try:
        first = replay_journal(d, LogMark(0, 0), lambda lid, eid, body: replayed.append(bytes(body)),
                               kernel=_journal.pure, max_record_bytes=max_rec)
    except StorageError:
        return
    # a replay that cut a torn tail leaves a journal the next replay reads whole
    again = []
    second = replay_journal(d, LogMark(0, 0), lambda lid, eid, body: again.append(bytes(body)),
                            kernel=_journal.pure, max_record_bytes=max_rec)
    check(second.cut_tail is None and again == replayed and second.end_mark == first.end_mark,
          f"replay after a cut differs: {first} then {second}")


# ---------------------------------------------------------------- entry logs
_MAX_ENTRIES = (16, 17, 64, 1024, 1 << 20, 0xFFFFFFFF, 32, 5 << 20)


def entrylog(data: bytes) -> None:
    p, buf = params(data, 2)
    max_entry = _MAX_ENTRIES[p[0] & 7]
    start = min(p[1], len(buf))
    _entrylog.same("scan_log", buf, start, len(buf), max_entry, normalize=plain)
    with allowed(efmt.HeaderError):
        header = efmt.decode_header(buf)
        with allowed(ValueError):
            efmt.decode_ledgers_map(buf[header.map_offset:header.map_offset + 4096], header.map_count)
    # file level: the bytes are entry log 0 (p[1] odd: behind a valid header of an unclosed log)
    d = scratch("entrylog")
    content = efmt.encode_header(0) + buf if p[1] & 1 else buf
    _write(os.path.join(efmt.log_dir(d), efmt.log_file_name(0)), content)
    cfg = load_config(overrides=dict(ledger_dirs=[d], max_frame_size_bytes=max(1024, max_entry & 0xFFFFFF)), env={})
    el = EntryLogger([d], cfg)
    try:
        with allowed(StorageError):
            usage = el.ledgers_map(0)
            check(all(isinstance(k, int) and v >= 0 for k, v in usage.items()), f"ledgers map {usage!r:.200}")
        with allowed(StorageError):
            scan = el.scan(0, with_entries=True)
            records = list(scan)
            check(scan.status is not None, "scan ended without a status")
            for lid, eid, location, size, entry in records[:8]:
                check(len(entry) == size and efmt.entry_ids(entry) == (lid, eid), "scan entry mismatch")
                check(el.read_entry(lid, eid, location) == entry, "read_entry differs from the scan")
            if records:
                run = el.read_run(records[0][2], 4, 4096)
                check([r[3] for r in run] == [r[2] for r in records[:len(run)]], "read_run differs from the scan")
    finally:
        el.close()


# ---------------------------------------------------------------- index
_INDEX_CONFIG = None


def _index_env():
    global _INDEX_CONFIG
    if _INDEX_CONFIG is None:
        d = scratch("index")
        _INDEX_CONFIG = Index(d, load_config(overrides=dict(index_map_size_bytes="8MiB", index_sync=False), env={}))
    return _INDEX_CONFIG


def _records(buf: bytes):
    """(db, key, value) records: `db u8 | key_len u8 | key | value_len u8 | value`, repeated."""
    pos, out = 0, []
    while pos + 3 <= len(buf):
        db, klen = buf[pos] % 3, buf[pos + 1]
        key = buf[pos + 2:pos + 2 + klen]
        pos += 2 + klen
        vlen = buf[pos] if pos < len(buf) else 0
        value = buf[pos + 1:pos + 1 + vlen]
        pos += 1 + vlen
        if key:
            out.append((db, key, value))
    return out


def index(data: bytes) -> None:
    p, buf = params(data, 1)
    # the byte formats alone
    with allowed(StorageError):
        ist.LedgerState.decode(buf)
    with allowed(StorageError):
        ist.decode_log_mark(buf)
    with allowed(StorageError):
        ist.decode_flag("unclean_shutdown", buf)
    ist.parse_compacting_log_key(buf)
    n = len(buf) // LOCATION_RECORD_BYTES
    packed = buf[:n * LOCATION_RECORD_BYTES]
    with allowed(ValueError):
        _index.same("location_items", packed, p[0] % (n + 1), n, normalize=lambda it: plain(list(it)))
    cols = [list(struct.unpack(f">{n}q", packed[i * 8 * n:(i + 1) * 8 * n])) for i in range(3)] if n else [[], [], []]
    with allowed(ValueError):
        _index.same("pack_locations", *cols, normalize=plain)
    # the same bytes as records in a real LMDB index, read by every reader the bookie has
    idx = _index_env()
    env = idx._env  # the harness plants raw records: no reader of bk writes through here
    dbs = (idx._locations, idx._ledgers, idx._state)
    with env.begin(write=True) as txn:
        for db in dbs:
            txn.drop(db, delete=False)
        for db, key, value in _records(buf):
            txn.put(key, value, db=dbs[db])
    with allowed(StorageError):
        for lid, state in idx.ledgers():
            check(idx.get_ledger(lid) == state, "get_ledger differs from ledgers()")
    with allowed(StorageError):
        locations = list(idx.iter_locations(batch=3))
        for lid, eid, loc in locations[:16]:
            check(idx.get_location(lid, eid) in (loc, None), "get_location differs from iter_locations")
            check(idx.last_entry_id(lid) is not None, "a ledger with locations has no last entry")
    with allowed(StorageError):
        idx.get_flag("unclean_shutdown")
    with allowed(StorageError):
        idx.get_log_mark(0)
    with allowed(StorageError):
        idx.compacting_logs()
    with allowed(StorageError):
        idx.location_count()


TARGETS = {"journal": journal, "entrylog": entrylog, "index": index}

