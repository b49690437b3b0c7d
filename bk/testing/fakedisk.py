"""A fake statvfs for tests: filesystems with chosen sizes, installed into bk.fileio.

    with FakeStatvfs() as fs:
        fs.mount("/data/a", total_bytes=1000, free_bytes=300)   # every path under it
        fs.mount("/data/b", total_bytes=4000, free_bytes=100, reserved_bytes=50)
        fileio.disk_space("/data/a/ledgers")  # DiskUsage(1000, 300, 0.7, fs_id)

A path belongs to the longest mounted prefix; a path under no mount raises ENOENT (a test
names every dir it uses). `free_bytes` is what an unprivileged writer may use (f_bavail);
`reserved_bytes` is root's reserve on top (f_bfree = free + reserved), so a reader that
takes f_bfree for free space is caught. Each call records whether it ran on a thread with a
running event loop (`calls_on_loop`) and the calling thread's name (`threads`): statvfs may
block on a sick disk, and neither the event loop nor the default executor (the read path's)
may wait for it.
"""
from __future__ import annotations

import asyncio
import errno
import os
import threading
from typing import NamedTuple

from bk import fileio

BLOCK_BYTES = 1  # f_frsize: sizes are given in bytes


class _StatvfsResult(NamedTuple):
    """The fields of os.statvfs_result that bk reads."""
    f_frsize: int
    f_blocks: int
    f_bfree: int
    f_bavail: int
    f_fsid: int


class FakeStatvfs:
    def __init__(self):
        self._mounts: dict[str, _StatvfsResult] = {}
        self._lock = threading.Lock()
        self.calls: list[str] = []
        self.calls_on_loop: list[str] = []
        self.threads: set[str] = set()  # names of the threads that called

    def mount(self, path: str, *, total_bytes: int, free_bytes: int, reserved_bytes: int = 0) -> None:
        """A filesystem at `path` (replaces one mounted there before: a disk filling up)."""
        if not 0 <= free_bytes + reserved_bytes <= total_bytes:
            raise ValueError(f"free {free_bytes} + reserved {reserved_bytes} must fit in total {total_bytes}")
        path = os.path.abspath(path)
        with self._lock:
            old = self._mounts.get(path)
            fsid = old.f_fsid if old else len(self._mounts) + 1
            self._mounts[path] = _StatvfsResult(BLOCK_BYTES, total_bytes, free_bytes + reserved_bytes, free_bytes,
                                                fsid)

    def __call__(self, path) -> _StatvfsResult:
        path = os.path.abspath(os.fspath(path))
        try:
            on_loop = asyncio.get_running_loop() is not None
        except RuntimeError:
            on_loop = False
        with self._lock:
            self.calls.append(path)
            self.threads.add(threading.current_thread().name)
            if on_loop:
                self.calls_on_loop.append(path)
            best = max((m for m in self._mounts if path == m or path.startswith(m.rstrip("/") + "/")),
                       key=len, default=None)
            if best is None:
                raise FileNotFoundError(errno.ENOENT, "no fake filesystem holds this path", path)
            return self._mounts[best]

    def install(self) -> "FakeStatvfs":
        fileio.set_statvfs(self)
        return self

    def uninstall(self) -> None:
        fileio.set_statvfs(None)

    def __enter__(self) -> "FakeStatvfs":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()
