"""Peak resident memory of server processes during a benchmark run (Linux /proc).

    with RssSampler({"bookie-0": pid}) as rss:
        ... run the load ...
    rss.peak_mib()    # {"bookie-0": 123.4}

A thread reads VmRSS from /proc/<pid>/status every `interval_s` and keeps the
maximum; on stop it also reads VmHWM (the kernel's own high-water mark since
the process started) and reports the larger of the two for processes started
for this run. VmHWM alone would do for a fresh process, but a process that
lives across runs keeps its old peak there, so the sampled VmRSS maximum is the
per-run figure (`use_hwm=False`). A process that exits mid-run keeps whatever
was sampled before.
"""
from __future__ import annotations

import threading

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


class RssSampler:
    def __init__(self, pids: dict, interval_s: float = 0.1, use_hwm: bool = True):
        self.pids = dict(pids)
        self.interval_s = interval_s
        self.use_hwm = use_hwm
        self._peak_kib = {name: 0 for name in self.pids}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        for name, pid in self.pids.items():
            rss = read_status_kib(pid, ("VmRSS",)).get("VmRSS")
            if rss is not None and rss > self._peak_kib[name]:
                self._peak_kib[name] = rss

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
            if self.use_hwm:
                for name, pid in self.pids.items():
                    hwm = read_status_kib(pid, ("VmHWM",)).get("VmHWM")
                    if hwm is not None and hwm > self._peak_kib[name]:
                        self._peak_kib[name] = hwm
        return self.peak_mib()

    def peak_mib(self) -> dict:
        """{name: peak MiB}; None for a process never seen (already gone, or not Linux)."""
        return {name: (kib * 1024 / MiB if kib else None) for name, kib in self._peak_kib.items()}

    def __enter__(self) -> "RssSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
