"""Disk faults that real disks have, injected at bk's one file layer (bk.fileio). Tests only.

Stable API (the chaos runner's disk nemeses are built on it; docs/DISK-FAULTS.md says what
the bookie does on each fault).

In one process (in-process bookies, unit tests)::

    faults = DiskFaults.install()             # this process's injector (idempotent)
    rule = faults.fail(op="fsync", errno=errno.EIO, path_prefix=journal_dir, count=1)
    rule = faults.fail(op="write", errno=errno.ENOSPC, path_prefix=ledger_dir)  # count=None: forever
    rule = faults.full_disk(bookie_dir)        # every write/commit ENOSPC, space reported 100% used
    faults.hits(rule) -> int                   # times it fired so far
    faults.heal(rule); faults.heal()           # remove one rule; remove all
    DiskFaults.uninstall()                     # back to zero cost

Real `bk bookie` processes: start them with the environment of a control file and drive
them with the same verbs (one control file per bookie, or one shared with path prefixes)::

    ctl = DiskFaultControl(path)               # creates the control file (no rules)
    env = {**os.environ, **ctl.env()}          # BK_DISK_FAULTS=<path>: the bookie reads it
    rule = ctl.fail(op="fsync", errno=errno.EIO, path_prefix=d, count=1)
    ctl.full_disk(d); ctl.hits(rule); ctl.heal(rule); ctl.heal()

A process re-reads the control file when it changes (one stat per file operation, only
while BK_DISK_FAULTS is set), so a rule applies from the next operation on; every fault
it injects is appended to `<path>.hits` (`rule id, op, errno, path`, tab-separated).
Counts (`count`, `after`) are per process: a restarted bookie meets a rule afresh (heal
first if it should not). One DiskFaultControl (one thread) writes a given control file.
After a full disk is healed, a bookie turns writable at its next disk check
(`disk_check_interval_ms`).

Rules (`fail`): `op` is "write" (any write, including creating a file), "fsync" (file and
directory fsyncs), "read" (entry-log reads), "commit" (the index's LMDB commit) or "any";
`errno` the error raised (EIO, ENOSPC, ...) ("any" also matches bk.fileio's
"mkdir", "rename" and "unlink" checks); `path_prefix` limits it to paths under a
directory (None: every path); `after` skips that many matching operations first; `count`
fires that many times then stops (None: until healed). An fsync fault with
`drop_unsynced=True` (the default) also does what Linux does after a failed writeback
(fsyncgate): the bytes written since the file's last good fsync are gone (zeroed), so
code that retries the fsync and trusts it is caught reading zeros. A write fault with
`partial_bytes=n` first writes n junk bytes (a short write before ENOSPC).

A hung disk (`hang`): `rule = ctl.hang(op="fsync", path_prefix=d)` makes every matching
operation block (the calling thread sleeps, as one in a D-state fsync does) until the rule
is healed; then the operation goes on and succeeds. `hits(rule)` counts the operations
that hung.

A crash gate (`faults.close_gate(dir)`, `open_gate(dir)`; InProcessCluster.crash_bookie):
from the call on, every operation under `dir` fails with EIO, one hung on a hang rule
included; `heal()` leaves gates alone.

Corruption of stored bytes (run against a bookie's directories once the entry is on disk,
e.g. after a checkpoint; a running bookie may still serve the entry from a cache)::

    flip_entry_bit(ledger_dirs, ledger_id, entry_id, part="payload"|"ids"|"size", bit=0)
    truncate_entry(ledger_dirs, ledger_id, entry_id)    # cut the log inside the record
    flip_journal_bit(journal_dirs, ledger_id, entry_id, part="payload"|"ids", bit=0)
    flip_bit(path, offset, bit=0)
"""
from __future__ import annotations

import errno as errno_mod
import itertools
import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field

from bk import fileio
from bk.fileio import DiskUsage
from bk.testing.corruption import flip_bit, flip_entry_bit, flip_journal_bit, truncate_entry

ENV_VAR = "BK_DISK_FAULTS"
OPS = ("write", "fsync", "read", "commit", "any")
_FULL_OPS = ("write", "commit")  # what a full disk refuses (reads and fsyncs of written data go on)
_JUNK = b"\xa5"


@dataclass
class Rule:
    id: int
    op: str
    errno: int
    path_prefix: str | None = None
    count: int | None = None
    after: int = 0
    drop_unsynced: bool = True
    partial_bytes: int = 0
    full: bool = False  # a full disk: write/commit ENOSPC and space() reports it full
    hang: bool = False  # a hung disk: the operation blocks until the rule is healed

    def matches(self, op: str, path: str) -> bool:
        if self.full:
            if op not in _FULL_OPS:
                return False
        elif self.op != "any" and self.op != op:
            return False
        return self.path_prefix is None or _under(path, self.path_prefix)


@dataclass
class _State:
    skipped: int = 0
    fired: int = 0


def _under(path: str, prefix: str) -> bool:
    path = os.path.abspath(path)
    return path == prefix or path.startswith(prefix.rstrip(os.sep) + os.sep)


def _make_rule(rule_id: int, op: str, errno: int, path_prefix, count, after, drop_unsynced,
               partial_bytes) -> Rule:
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, not {op!r}")
    if count is not None and count < 1:
        raise ValueError("count must be at least 1 (or None: until healed)")
    return Rule(rule_id, op, int(errno), os.path.abspath(path_prefix) if path_prefix else None,
                count, int(after), bool(drop_unsynced), int(partial_bytes))


class _Injector:
    """What bk.fileio calls (check/space). Thread-safe: journal, flush and read threads call it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self._states: dict[int, _State] = {}
        # crash gates (bk.testing.inprocess's abrupt crash): directories of crashed bookies;
        # every operation under one fails from the crash instant on (heal() leaves them)
        self._gates: tuple[str, ...] = ()

    def _current_rules(self) -> list[Rule]:
        return self._rules

    def _gated(self, path: str) -> bool:
        gates = self._gates
        return bool(gates) and any(_under(path, g) for g in gates)

    def close_gate(self, *path_prefixes: str) -> None:
        """From now on every file operation under each of `path_prefixes` fails with EIO,
        including those blocked by a hang rule (they fail instead of going on): nothing more of
        a crashed bookie reaches its disk. Several prefixes close in one step (one tuple
        assignment), so the bookies of a whole-cluster power cut stop at the same instant."""
        with self._lock:
            self._gates = (*self._gates, *(os.path.abspath(p) for p in path_prefixes))

    def open_gate(self, path_prefix: str) -> None:
        prefix = os.path.abspath(path_prefix)
        with self._lock:
            gates = list(self._gates)
            if prefix in gates:
                gates.remove(prefix)
            self._gates = tuple(gates)

    def check(self, op: str, path: str, f) -> None:
        if self._gates and self._gated(path):
            raise OSError(errno_mod.EIO, "the bookie crashed (crash gate)", path)
        rules = self._current_rules()
        if not rules:
            return
        with self._lock:
            for rule in rules:
                if not rule.matches(op, path):
                    continue
                st = self._states.setdefault(rule.id, _State())
                if st.skipped < rule.after:
                    st.skipped += 1
                    continue
                if rule.count is not None and st.fired >= rule.count:
                    continue
                st.fired += 1
                self._record(rule, op, path)
                break
            else:
                return
        if rule.hang:
            while any(r.id == rule.id for r in self._current_rules()):
                if self._gates and self._gated(path):  # crashed while hung: the write never happens
                    raise OSError(errno_mod.EIO, "the bookie crashed (crash gate)", path)
                time.sleep(0.05)
            return
        if f is not None and f.fd >= 0:
            if op == "fsync" and rule.drop_unsynced and f.size > f.synced_size:
                # what the kernel may do after a failed writeback: the dirty pages are dropped
                os.pwrite(f.fd, bytes(f.size - f.synced_size), f.synced_size)
            elif op == "write" and rule.partial_bytes:
                n = os.pwrite(f.fd, _JUNK * rule.partial_bytes, f.size)
                f.size += n
        raise OSError(rule.errno, f"{os.strerror(rule.errno)} (injected by rule {rule.id})", path)

    def space(self, path: str) -> DiskUsage | None:
        for rule in self._current_rules():
            if rule.full and rule.path_prefix is not None and (
                    _under(path, rule.path_prefix) or _under(rule.path_prefix, path)):
                total = fileio_total_bytes(path)
                return DiskUsage(total, 0, 1.0)
        return None

    def _record(self, rule: Rule, op: str, path: str) -> None:
        """Called under the lock when a rule fires."""

    def fired(self, rule_id: int) -> int:
        with self._lock:
            st = self._states.get(rule_id)
            return st.fired if st else 0


def fileio_total_bytes(path: str) -> int:
    try:
        return fileio.measured_space(path).total_bytes
    except OSError:
        return 0


class DiskFaults(_Injector):
    """The in-process injector; one per process (install())."""

    _installed: "DiskFaults | None" = None
    _ids = itertools.count(1)

    @classmethod
    def install(cls) -> "DiskFaults":
        if cls._installed is None or fileio.faults is not cls._installed:
            cls._installed = cls()
            fileio.set_fault_injector(cls._installed)
        return cls._installed

    @classmethod
    def uninstall(cls) -> None:
        if fileio.faults is cls._installed:
            fileio.set_fault_injector(None)
        cls._installed = None

    def fail(self, *, op: str, errno: int = errno_mod.EIO, path_prefix: str | None = None,
             count: int | None = 1, after: int = 0, drop_unsynced: bool = True, partial_bytes: int = 0) -> int:
        """Add a rule (see the module docstring); returns its id."""
        rule = _make_rule(next(self._ids), op, errno, path_prefix, count, after, drop_unsynced, partial_bytes)
        with self._lock:
            self._rules = [*self._rules, rule]
        return rule.id

    def full_disk(self, path_prefix: str) -> int:
        """Everything under `path_prefix` is on a full disk until healed; returns the rule id."""
        rule = Rule(next(self._ids), "write", errno_mod.ENOSPC, os.path.abspath(path_prefix), full=True)
        with self._lock:
            self._rules = [*self._rules, rule]
        return rule.id

    def hang(self, *, op: str, path_prefix: str | None = None) -> int:
        """Every matching operation blocks until this rule is healed; returns its id."""
        rule = _make_rule(next(self._ids), op, 0, path_prefix, None, 0, False, 0)
        rule.hang = True
        with self._lock:
            self._rules = [*self._rules, rule]
        return rule.id

    def heal(self, rule_id: int | None = None) -> None:
        """Remove one rule, or every rule."""
        with self._lock:
            self._rules = [r for r in self._rules if rule_id is not None and r.id != rule_id]

    def hits(self, rule_id: int) -> int:
        return self.fired(rule_id)

    def rules(self) -> list[Rule]:
        return list(self._rules)


# ---------------------------------------------------------------------------- processes
class _ControlledInjector(_Injector):
    """A bookie process's injector: rules come from the control file named by BK_DISK_FAULTS."""

    def __init__(self, control_path: str):
        super().__init__()
        self._path = control_path
        self._seen: tuple | None = None
        self._hits_fd: int | None = None

    def _current_rules(self) -> list[Rule]:
        try:
            st = os.stat(self._path)
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            key = None
        if key != self._seen:
            with self._lock:
                if key != self._seen:
                    self._rules = _load_rules(self._path) if key is not None else []
                    self._seen = key
        return self._rules

    def _record(self, rule: Rule, op: str, path: str) -> None:
        if self._hits_fd is None:
            self._hits_fd = os.open(self._path + ".hits", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(self._hits_fd, f"{rule.id}\t{op}\t{rule.errno}\t{path}\n".encode())


def _load_rules(path: str) -> list[Rule]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return []
    return [Rule(**r) for r in data.get("rules", [])]


def install_from_env() -> bool:
    """Called by `bk bookie` at start: install the control-file injector when BK_DISK_FAULTS is set."""
    path = os.environ.get(ENV_VAR)
    if not path:
        return False
    fileio.set_fault_injector(_ControlledInjector(os.path.abspath(path)))
    return True


@dataclass
class DiskFaultControl:
    """The test side of a control file (see the module docstring)."""

    path: str
    _rules: list = field(default_factory=list)
    _next_id: int = 1
    _mtime_ns: int = 0

    def __post_init__(self):
        self.path = os.path.abspath(self.path)
        if os.path.exists(self.path):
            self._rules = _load_rules(self.path)
            self._next_id = max((r.id for r in self._rules), default=0) + 1
        self._save()

    def env(self) -> dict[str, str]:
        return {ENV_VAR: self.path}

    def fail(self, *, op: str, errno: int = errno_mod.EIO, path_prefix: str | None = None,
             count: int | None = 1, after: int = 0, drop_unsynced: bool = True, partial_bytes: int = 0) -> int:
        rule = _make_rule(self._take_id(), op, errno, path_prefix, count, after, drop_unsynced, partial_bytes)
        self._rules.append(rule)
        self._save()
        return rule.id

    def full_disk(self, path_prefix: str) -> int:
        rule = Rule(self._take_id(), "write", errno_mod.ENOSPC, os.path.abspath(path_prefix), full=True)
        self._rules.append(rule)
        self._save()
        return rule.id

    def hang(self, *, op: str, path_prefix: str | None = None) -> int:
        """Every matching operation blocks until this rule is healed (a hung disk)."""
        rule = _make_rule(self._take_id(), op, 0, path_prefix, None, 0, False, 0)
        rule.hang = True
        self._rules.append(rule)
        self._save()
        return rule.id

    def heal(self, rule_id: int | None = None) -> None:
        self._rules = [r for r in self._rules if rule_id is not None and r.id != rule_id]
        self._save()

    def hits(self, rule_id: int | None = None) -> int:
        """Faults injected so far by every process reading this file (by one rule, or all)."""
        try:
            with open(self.path + ".hits", encoding="utf-8") as fh:
                return sum(1 for line in fh if rule_id is None or line.split("\t", 1)[0] == str(rule_id))
        except FileNotFoundError:
            return 0

    def _take_id(self) -> int:
        rule_id, self._next_id = self._next_id, self._next_id + 1
        return rule_id

    def _save(self) -> None:
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"rules": [asdict(r) for r in self._rules]}, fh)
        # a strictly newer mtime each time: readers notice a change by one stat, even when
        # the new file has the old one's size and (recycled) inode number
        self._mtime_ns = max(time.time_ns(), self._mtime_ns + 1000)
        os.utime(tmp, ns=(self._mtime_ns, self._mtime_ns))
        os.replace(tmp, self.path)  # a reader sees the old or the new rules, never half


__all__ = ["DiskFaults", "DiskFaultControl", "Rule", "install_from_env", "ENV_VAR", "flip_bit",
           "flip_entry_bit", "flip_journal_bit", "truncate_entry"]
