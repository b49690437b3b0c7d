"""Which entry logs the index names, and do they still hold what it names? (issue 27)

The index outlives the entry logs it points into when one of several ledger dirs is wiped
or replaced (the index lives in the first), when a log is deleted by hand or by a GC bug,
or when a disk loses a file's tail. Every location into such a log is an entry this
bookie stored (maybe acknowledged) and no longer has. Asked only "is it in the index?",
the BP-46 repair counted those entries as present: it cleared limbo, said "done, 0
errors", and they answered EIO for ever.

So at every start, before the entry logger opens a log (LedgerStorage), the index is
walked once (Index.locations_by_log: each log id it names, how many locations, the
highest) and compared with the log files of the ledger dirs:
- a log the index names that no ledger dir holds is **missing**: everything in it is dead;
- a log whose highest named record does not end inside the file is **truncated**: a file
  loses a suffix, and records are written back to back, so its records are whole up to
  one point and gone from there on. That point (`dead_from`) is the lowest offset among
  the named records that do not fit; only records within one maximal entry of the end
  need their size field read to know.
Only when something is dead is the index walked again, to find which ledgers have entries
in the dead parts (they go to limbo and the integrity check, bk.server.integrity).

A location is dead when it points at or past `dead_from` of its log. That stays true
only while the index holds that location: the repair's copy of the entry gets a new
location, which replaces the dead one, so nothing here needs clearing. The next start
checks again from scratch: a repair cut short by a crash finds the same entries dead.

`highest_log_id` keeps lost ids from being reborn: a new log must take an id above every
log the index names (EntryLogger's first_log_id), or the dead locations would point into
unrelated records of a new file (and look alive at the next start).

Pure file and index reads: the bookie runs it at boot, `bk shell entrylogcheck` on the
files of a stopped bookie.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

from bk.formats import entrylog as fmt
from bk.errors import StorageError

log = logging.getLogger(__name__)

_OFFSET_MASK = (1 << 32) - 1
_HEAD_BYTES = fmt.LOG_RECORD_HEAD_BYTES  # the shortest whole record


@dataclass
class DeadLog:
    log_id: int
    state: str  # "missing" | "truncated"
    file_bytes: int  # 0 when missing
    named: int  # locations the index names in it
    dead: int = 0  # of those, records that are gone
    dead_from: int = 0  # offsets from here on are gone (0 for a missing log)

    def as_dict(self) -> dict:
        return {"log_id": f"{self.log_id:x}", "state": self.state, "file_bytes": self.file_bytes,
                "named": self.named, "dead": self.dead, "dead_from": self.dead_from}


@dataclass
class LogCheck:
    logs_named: int = 0
    logs_present: int = 0
    locations: int = 0
    highest_log_id: int = -1  # the highest log id named by the index or present on disk
    dead_logs: list[DeadLog] = field(default_factory=list)
    ledgers: dict[int, int] = field(default_factory=dict)  # ledger id -> dead entries
    elapsed_s: float = 0.0

    @property
    def dead_entries(self) -> int:
        return sum(d.dead for d in self.dead_logs)

    @property
    def dead_from(self) -> dict[int, int]:
        return {d.log_id: d.dead_from for d in self.dead_logs}

    def summary(self) -> str:
        if not self.dead_logs:
            return (f"entry logs whole: {self.logs_named} named by the index ({self.locations} locations),"
                    f" {self.logs_present} present")
        parts = [f"{d.log_id:x} {d.state}" + (f" at {d.dead_from} of {d.file_bytes} bytes" if d.state == "truncated"
                                              else "") + f" ({d.dead} entries)" for d in self.dead_logs]
        more = f" and {len(parts) - 20} more logs" if len(parts) > 20 else ""
        return (f"{self.dead_entries} entries of {len(self.ledgers)} ledgers are gone with their entry logs: "
                + ", ".join(parts[:20]) + more)

    def as_dict(self) -> dict:
        return {"ok": not self.dead_logs, "logs_named": self.logs_named, "logs_present": self.logs_present,
                "locations": self.locations, "dead_entries": self.dead_entries,
                "dead_logs": [d.as_dict() for d in self.dead_logs],
                "ledgers": {str(k): v for k, v in sorted(self.ledgers.items())},
                "elapsed_s": round(self.elapsed_s, 3)}


def is_dead(dead_from: dict[int, int], location: int) -> bool:
    """Does `location` point into what check_entry_logs found gone?"""
    start = dead_from.get(location >> 32)
    return start is not None and (location & _OFFSET_MASK) >= start


def log_files(ledger_dirs) -> dict[int, str]:
    """log id -> path of every entry log file in the ledger dirs (a dir that is gone has none)."""
    out = {}
    for d in ledger_dirs:
        try:
            names = os.listdir(fmt.log_dir(d))
        except FileNotFoundError:
            continue
        for name in names:
            log_id = fmt.parse_log_file_name(name)
            if log_id is not None:
                out[log_id] = os.path.join(fmt.log_dir(d), name)
    return out


def _record_size(fd: int, offset: int) -> int | None:
    head = os.pread(fd, fmt.LOG_SIZE_FIELD_BYTES, offset)
    return int.from_bytes(head, "big") if len(head) == fmt.LOG_SIZE_FIELD_BYTES else None


def _fits(fd: int, offset: int, file_bytes: int, max_entry_bytes: int) -> bool:
    """Does the record at `offset` end inside the file? (a size field out of range: no)"""
    if offset + _HEAD_BYTES > file_bytes or offset < fmt.LOG_HEADER_BYTES:
        return False
    if offset + fmt.LOG_SIZE_FIELD_BYTES + max_entry_bytes <= file_bytes:
        return True  # even the largest entry ends inside
    size = _record_size(fd, offset)
    return size is not None and fmt.LOG_MIN_ENTRY_BYTES <= size <= max_entry_bytes and \
        offset + fmt.LOG_SIZE_FIELD_BYTES + size <= file_bytes


def check_entry_logs(index, ledger_dirs, max_entry_bytes: int) -> LogCheck:
    """Compare what the index names with the entry log files (module docstring). Blocking.
    A file that cannot be read is a StorageError: the start stops, nothing is guessed."""
    try:
        return _check(index, ledger_dirs, max_entry_bytes)
    except OSError as e:
        raise StorageError(f"entry log check: cannot read {e.filename or 'an entry log'}: {e.strerror}") from e


def _check(index, ledger_dirs, max_entry_bytes: int) -> LogCheck:
    t0 = time.monotonic()
    files = log_files(ledger_dirs)
    named = index.locations_by_log()
    out = LogCheck(logs_named=len(named), logs_present=len(files),
                   locations=sum(c for c, _ in named.values()),
                   highest_log_id=max([*named, *files], default=-1))
    for log_id in sorted(named):
        count, highest = named[log_id]
        path = files.get(log_id)
        if path is None:
            out.dead_logs.append(DeadLog(log_id, "missing", 0, count))
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if not _fits(fd, highest & _OFFSET_MASK, size, max_entry_bytes):
                out.dead_logs.append(DeadLog(log_id, "truncated", size, count, dead_from=size))
        finally:
            os.close(fd)
    if out.dead_logs:
        _find_dead(index, files, out, max_entry_bytes)
        log.error("entry log check: %s", out.summary())
    out.elapsed_s = time.monotonic() - t0
    return out


def _find_dead(index, files: dict[int, str], out: LogCheck, max_entry_bytes: int) -> None:
    """Second walk: the dead locations, their ledgers, and each truncated log's dead_from.
    Memory: a count per ledger, plus the locations within one maximal entry of a cut end."""
    logs = {d.log_id: d for d in out.dead_logs}
    fds = {d.log_id: os.open(files[d.log_id], os.O_RDONLY) for d in out.dead_logs if d.state == "truncated"}

    def dead(d: DeadLog, ledger_id: int, offset: int) -> None:
        d.dead += 1
        d.dead_from = min(d.dead_from, offset)
        out.ledgers[ledger_id] = out.ledgers.get(ledger_id, 0) + 1
    try:
        near_end = []  # (log, ledger id, offset) whose record may or may not end inside the file
        for lid, _eid, loc in index.iter_locations():
            d = logs.get(loc >> 32)
            if d is None:
                continue
            offset = loc & _OFFSET_MASK
            if d.state == "truncated" and fmt.LOG_HEADER_BYTES <= offset and offset + _HEAD_BYTES <= d.file_bytes:
                if offset + fmt.LOG_SIZE_FIELD_BYTES + max_entry_bytes <= d.file_bytes:
                    continue  # even the largest entry would end inside: whole
                near_end.append((d, lid, offset))
                continue
            dead(d, lid, offset)  # a missing log, or a record that starts past the end
        for d, _lid, offset in near_end:
            if not _fits(fds[d.log_id], offset, d.file_bytes, max_entry_bytes):
                d.dead_from = min(d.dead_from, offset)
        # records are back to back: one past the first cut record is past the cut too
        for d, lid, offset in near_end:
            if offset >= d.dead_from:
                dead(d, lid, offset)
    finally:
        for fd in fds.values():
            os.close(fd)
