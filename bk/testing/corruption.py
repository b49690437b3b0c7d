"""Damage stored bytes the way a failing disk does: a flipped bit in an entry-log record
or a journal record, an entry-log record cut short or its size field garbled, an entry
log left without its ledgers map as a crash leaves one. Tests only (bk.testing.diskfaults
re-exports these; that module's docstring is the API).

Entries are found by walking the files (the pure scanners of the formats' owners), not
through the index, so these work on a stopped bookie's directories as on a running one's
(once the entry has reached the file: checkpoint first; a cache may still serve it).
"""
from __future__ import annotations

import os

from bk import fileio
from bk._native import load
from bk.entrylog.files import LogScan
from bk.formats import entrylog as fmt
from bk.formats.journal import JOURNAL_RECORD_HEAD_BYTES
from bk.journal.records import FILE_END, FILLER_LEDGER, check_header, list_files, parse_ids

_PARTS = ("payload", "ids", "size")


def flip_bit(path: str, offset: int, bit: int = 0) -> None:
    """Invert one bit of a file in place (and fsync it, so the damage survives a crash)."""
    fd = os.open(path, os.O_RDWR)
    try:
        byte = os.pread(fd, 1, offset)
        if len(byte) != 1:
            raise ValueError(f"{path} has no byte at offset {offset}")
        os.pwrite(fd, bytes([byte[0] ^ (1 << (bit % 8))]), offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def entry_records(ledger_dirs, ledger_id: int, entry_id: int) -> list[tuple[str, int, int]]:
    """Every copy of the entry in the entry logs under `ledger_dirs`: (path, record offset,
    entry size). A compacted entry may have an old copy in a log not yet deleted."""
    kernel = load("entrylog")
    found = []
    for d in ledger_dirs:
        log_dir = fmt.log_dir(d)
        if not os.path.isdir(log_dir):
            continue
        for name in sorted(os.listdir(log_dir)):
            log_id = fmt.parse_log_file_name(name)
            if log_id is None:
                continue
            path = os.path.join(log_dir, name)
            end = _records_end(path)
            for lid, eid, location, size in LogScan(kernel, path, log_id, end, 1 << 31):
                if (lid, eid) == (ledger_id, entry_id):
                    found.append((path, location & fmt.MAX_OFFSET, size))
    return found


def _records_end(path: str) -> int:
    with open(path, "rb") as fh:
        head = fh.read(fmt.LOG_HEADER_BYTES)
        size = os.fstat(fh.fileno()).st_size
    try:
        header = fmt.decode_header(head)
    except fmt.HeaderError:
        return size
    return header.map_offset if header.map_offset and header.map_offset <= size else size


def flip_entry_bit(ledger_dirs, ledger_id: int, entry_id: int, part: str = "payload",
                   bit: int = 0) -> list[tuple[str, int]]:
    """Flip one bit of every stored copy of the entry; returns the (path, offset) flipped.

    part "payload": bit `bit % 8` of the entry's last byte (the bookie serves it; the
    client's digest check fails); "ids": bit `bit` (0..63, 0 the lowest) of the entry id
    in the record (the bookie's own check fails: another entry id than the index
    promised); "size": a high bit of the size field (the record's length is out of range).
    A flipped id can make a record claim another entry's ids (4 -> 5 with bit 0), and a
    later call for that entry finds it too: a high bit (40) damages neighbours one by one."""
    if part not in _PARTS:
        raise ValueError(f"part must be one of {_PARTS}")
    copies = entry_records(ledger_dirs, ledger_id, entry_id)
    if not copies:
        raise LookupError(f"ledger {ledger_id} entry {entry_id} is in no entry log under {list(ledger_dirs)}")
    done = []
    if part == "ids" and not 0 <= bit < 64:
        raise ValueError("an entry id has bits 0..63")
    for path, offset, size in copies:
        at, which = {"payload": (offset + fmt.LOG_SIZE_FIELD_BYTES + size - 1, bit % 8),
                     "ids": (offset + fmt.LOG_SIZE_FIELD_BYTES + 15 - bit // 8, bit % 8),  # big-endian id
                     "size": (offset, 6)}[part]
        flip_bit(path, at, which)
        done.append((path, at))
    return done


def truncate_entry(ledger_dirs, ledger_id: int, entry_id: int) -> tuple[str, int]:
    """Cut the entry log holding the entry in the middle of its record (the last copy);
    returns (path, new size). Everything after it in that log is gone too."""
    copies = entry_records(ledger_dirs, ledger_id, entry_id)
    if not copies:
        raise LookupError(f"ledger {ledger_id} entry {entry_id} is in no entry log under {list(ledger_dirs)}")
    path, offset, size = copies[-1]
    new_size = offset + fmt.LOG_SIZE_FIELD_BYTES + size // 2
    os.truncate(path, new_size)
    return path, new_size


def strip_ledgers_map(path: str) -> int:
    """Make a closed entry log look like one a crash left: no ledgers map (header fields
    zeroed, file cut where the map began), so the bookie learns its usage by a scan.
    Durable (fsynced, and told to the power-loss tracker); returns the new size."""
    with open(path, "r+b") as fh:
        header = fmt.decode_header(fh.read(fmt.LOG_HEADER_BYTES))
        if not header.map_offset:
            raise ValueError(f"{path} has no ledgers map")
        fh.seek(0)
        fh.write(fmt.encode_header(header.log_id))
        fh.truncate(header.map_offset)
        fh.flush()
        os.fsync(fh.fileno())
    fileio._track(path, header.map_offset)  # the power-loss tracker: this size is durable
    return header.map_offset


def logs_holding(ledger_dirs, ledger_id: int) -> list[tuple[str, int, int]]:
    """(path, first record offset, last record offset) of the ledger in each entry log
    that holds it, by log id."""
    kernel = load("entrylog")
    found = []
    for d in ledger_dirs:
        log_dir = fmt.log_dir(d)
        for name in sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else ():
            log_id = fmt.parse_log_file_name(name)
            if log_id is None:
                continue
            path = os.path.join(log_dir, name)
            offsets = [loc & fmt.MAX_OFFSET for lid, _eid, loc, _size
                       in LogScan(kernel, path, log_id, _records_end(path), 1 << 31) if lid == ledger_id]
            if offsets:
                found.append((path, offsets[0], offsets[-1]))
    return found


def damage_record_size(path: str, offset: int) -> None:
    """Set the size field of the record at `offset` out of range (0xFFFFFFFF): a scan of
    the log stops there, as at a garbage record in the middle of a log. Durable."""
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, b"\xff\xff\xff\xff", offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def journal_records(journal_dirs, ledger_id: int, entry_id: int) -> list[tuple[str, int, int]]:
    """Every journal record of the entry: (path, record offset, body size)."""
    found = []
    for d in journal_dirs:
        for fid, path in list_files(d):
            with open(path, "rb") as fh:
                data = fh.read()
            _version, pos = check_header(data, fid, path)  # records start after the header (block)
            while pos + JOURNAL_RECORD_HEAD_BYTES <= len(data):
                n = int.from_bytes(data[pos:pos + 4], "big")
                body = data[pos + JOURNAL_RECORD_HEAD_BYTES:pos + JOURNAL_RECORD_HEAD_BYTES + n]
                if n < 16 or len(body) < n or parse_ids(body) == (FILLER_LEDGER, FILE_END):
                    break  # (a format 2 file's zeroed or stale tail: nothing of this file's)
                if parse_ids(body) == (ledger_id, entry_id):
                    found.append((path, pos, n))
                pos += JOURNAL_RECORD_HEAD_BYTES + n
    return found


def flip_journal_bit(journal_dirs, ledger_id: int, entry_id: int, part: str = "payload",
                     bit: int = 0) -> list[tuple[str, int]]:
    """Flip one bit in every journal record of the entry (its CRC then fails); returns
    the (path, offset) flipped. part "payload": the body's last byte; "ids": the entry id."""
    if part not in ("payload", "ids"):
        raise ValueError("part must be 'payload' or 'ids'")
    copies = journal_records(journal_dirs, ledger_id, entry_id)
    if not copies:
        raise LookupError(f"ledger {ledger_id} entry {entry_id} is in no journal under {list(journal_dirs)}")
    done = []
    for path, offset, n in copies:
        at = offset + JOURNAL_RECORD_HEAD_BYTES + (n - 1 if part == "payload" else 15)
        flip_bit(path, at, bit)
        done.append((path, at))
    return done
