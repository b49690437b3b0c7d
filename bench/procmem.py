"""Peak resident memory and CPU use of server processes during a benchmark run (Linux /proc).

    with RssSampler({"bookie-0": pid}) as rss:
        ... run the load ...
    rss.peak_mib()    # {"bookie-0": 123.4}
    rss.cpu_pct()     # {"bookie-0": 31.0}: CPU seconds (user + system, all threads) per wall second, in %

A thread reads VmRSS from /proc/<pid>/status every `interval_s` and keeps the
maximum; on stop it also reads VmHWM (the kernel's own high-water mark since
the process started) and reports the larger of the two for processes started
for this run. VmHWM alone would do for a fresh process, but a process that
lives across runs keeps its old peak there, so the sampled VmRSS maximum is the
per-run figure (`use_hwm=False`). A process that exits mid-run keeps whatever
was sampled before. CPU is the scheduler's run time of the process's threads
(read_cpu_s), first sample to last, over the same wall interval: 100 = one core.
"""
from __future__ import annotations

import os
import threading
import time

from .stats import MiB


def read_status_kib(pid: int, fields=("VmRSS", "VmHWM")) -> dict:
    """{field: kiB} from /proc/<pid>/status; fields the kernel does not show are left out."""
    out = {}
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for raw in fh:
                key, _, rest = raw.decode(errors="replace").partition(":")
                if key in fields:
                    parts = rest.split()
                    if parts and parts[0].isdigit():
                        out[key] = int(parts[0])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return out


def read_cpu_s(pid: int) -> float | None:
    """CPU seconds of every thread of `pid` so far (None if it is gone).

    Preferably the scheduler's exact run time per thread (/proc/<pid>/task/*/schedstat,
    nanoseconds): utime + stime in /proc/<pid>/stat are sampled at the timer tick,
    and on a tickless kernel a process that works in short bursts on an otherwise
    idle CPU is missed by most ticks (a bookie at 40,000 adds/s once showed 3%).
    Threads that exited are no longer summed; a bookie's threads live as long as it.
    Falls back to the tick figures where schedstat is missing."""
    total_ns, seen = 0, False
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as fh:
                total_ns += int(fh.read().split()[0])
                seen = True
        except (OSError, ValueError, IndexError):
            continue
    if seen:
        return total_ns / 1e9
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode(errors="replace")
    except OSError:
        return None
    # the command name may contain spaces and parentheses: fields start after the last ')'
    fields = raw[raw.rfind(")") + 2:].split()
    try:
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)
    except (IndexError, ValueError):
        return None


class RssSampler:
    def __init__(self, pids: dict, interval_s: float = 0.1, use_hwm: bool = True, disk=None, field: str = "VmRSS"):
        self.pids = dict(pids)
        self.field = field  # the /proc/<pid>/status figure sampled: VmRSS, or RssAnon / RssFile (no HWM)
        self.disk = disk  # a diskstats.BlockDevice: its written bytes are snapshot at each mark()
        self.interval_s = interval_s
        self.use_hwm = use_hwm
        self._peak_kib = {name: 0 for name in self.pids}
        self._cpu = {name: None for name in self.pids}  # (first cpu_s, first wall, last cpu_s, last wall)
        self._marks: dict[str, dict] = {}
        self._disk_marks: dict[str, tuple] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        for name, pid in self.pids.items():
            rss = read_status_kib(pid, (self.field,)).get(self.field)
            if rss is not None and rss > self._peak_kib[name]:
                self._peak_kib[name] = rss
            cpu, now = read_cpu_s(pid), time.monotonic()
            if cpu is not None:
                first = self._cpu[name]
                self._cpu[name] = (cpu, now, cpu, now) if first is None else (first[0], first[1], cpu, now)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)

    def start(self) -> "RssSampler":
        self._sample()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict:
        """Stop sampling (call while the processes still run, to read VmHWM); returns peak_mib()."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._sample()
            if self.use_hwm and self.field == "VmRSS":
                for name, pid in self.pids.items():
                    hwm = read_status_kib(pid, ("VmHWM",)).get("VmHWM")
                    if hwm is not None and hwm > self._peak_kib[name]:
                        self._peak_kib[name] = hwm
        return self.peak_mib()

    def peak_mib(self) -> dict:
        """{name: peak MiB}; None for a process never seen (already gone, or not Linux)."""
        return {name: (kib * 1024 / MiB if kib else None) for name, kib in self._peak_kib.items()}

    def mark(self, label: str) -> None:
        """Snapshot every process's CPU time now (e.g. at the start and end of the measured window)."""
        now = time.monotonic()
        self._marks[label] = {name: (read_cpu_s(pid), now) for name, pid in self.pids.items()}
        if self.disk is not None:
            self._disk_marks[label] = (self.disk.written_bytes(), now)

    def disk_mb_per_s(self, between: tuple[str, str]) -> float | None:
        """MB/s (10^6 bytes) written to the disk between two mark() labels; None if unknown."""
        a, b = (self._disk_marks.get(label) for label in between)
        if a is None or b is None or a[0] is None or b[0] is None or b[1] <= a[1]:
            return None
        return (b[0] - a[0]) / (b[1] - a[1]) / 1e6

    def cpu_pct(self, between: tuple[str, str] | None = None) -> dict:
        """{name: CPU % of one core}: between two mark() labels if given and both were
        marked, else between the first and last sample; None where unknown."""
        out = {}
        if between is not None and all(label in self._marks for label in between):
            a, b = (self._marks[label] for label in between)
            for name in self.pids:
                (c0, w0), (c1, w1) = a[name], b[name]
                out[name] = None if c0 is None or c1 is None or w1 <= w0 else 100.0 * (c1 - c0) / (w1 - w0)
            return out
        for name, c in self._cpu.items():
            out[name] = None if c is None or c[3] <= c[1] else 100.0 * (c[2] - c[0]) / (c[3] - c[1])
        return out

    def __enter__(self) -> "RssSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
