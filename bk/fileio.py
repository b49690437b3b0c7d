"""The one file layer every durable write goes through.

Why it exists: `kill -9` cannot show that fsync is called at the right moments,
because the page cache survives the process. With `BK_FSYNC_TRACK_FILE` set, this
layer appends `path<TAB>size` to that file after every successful fsync, so a
crash test can truncate every file to its last fsynced size (bk.testing.powerloss)
and check that everything acknowledged is still there. The record is written
after the fsync returns and before the caller can acknowledge anything.

Directory entries are tracked too (only while tracking is on): `fsync_dir` logs the
directory's listing as it was when the fsync began (`#D`), a new directory is logged
empty (`#D`, nothing in it is durable until it is fsynced), and before `remove_file`
unlinks a file or `atomic_write` renames over one, the old file is hard-linked aside
(`#U`/`#R` with the link's path, under `<track file>.shadow/`), so a power cut before
the directory's next fsync can undo the unlink or the rename.

LMDB does its own fsyncs and is not tracked here; bk.testing.powerloss models its
files (docs/DISK-FAULTS.md, "Power loss").

Fault injection (tests only, bk.testing.diskfaults). `faults` is None in production:
every operation below pays one module-global compare. When a test installs an
injector, each operation asks it first: `faults.check(op, path, f)` may raise OSError
(op is "write", "fsync", "read", "commit", "mkdir", "rename" or "unlink"; `f` is the
DurableFile or None), and
`faults.space(path)` may report a directory full. The Cython kernels do no I/O (they
frame and scan buffers), so every durable write and fsync of the bookie passes here;
LMDB's commit is checked by bk.index through `check_commit` before LMDB commits.

fsyncgate. After a failed fsync the kernel may have dropped the dirty pages it could
not write and marks them clean: a later fsync that succeeds proves nothing about them.
So a DurableFile whose fsync failed refuses every later fsync (SyncFailedError): its
owner must treat everything written since the last good fsync as lost, and write it
again elsewhere from a copy it still holds, or never acknowledge it.
"""
from __future__ import annotations

import errno
import os
import threading

from typing import NamedTuple

from bk.errors import DiskFullError, StorageError, SyncFailedError

IOV_MAX = 1024  # Linux's limit on buffers per writev/pwritev (journal, entry logs, sockets)
PAGE_BYTES = 4096  # page-cache granularity for drop_synced_pages (a multiple of the real size is fine)
_track_lock = threading.Lock()
_track_fd: int | None = None
_track_path: str | None = None
# The installed fault injector (bk.testing.diskfaults), None when off: see the docstring.
faults = None


def set_fault_injector(injector) -> None:
    """Install (or with None remove) the test-only fault injector for this process."""
    global faults
    faults = injector


class DiskUsage(NamedTuple):
    """Space of one filesystem, as BookKeeper's DiskChecker reads it (java.io.File's
    getTotalSpace / getUsableSpace): `free_bytes` is what an unprivileged writer may still
    use (f_bavail, not f_bfree: root's reserve is not the bookie's), `usage` = 1 - free/total."""
    total_bytes: int
    free_bytes: int
    usage: float  # fraction of the disk in use, 0..1
    fs_id: object = None  # which filesystem (None: an injected fake, counted as its own)


# The statvfs that every space figure comes from; bk.testing.fakedisk swaps in a fake.
_statvfs = os.statvfs


def set_statvfs(fn) -> None:
    """Install (or with None remove) a test-only replacement for os.statvfs."""
    global _statvfs
    _statvfs = fn if fn is not None else os.statvfs


def measured_space(path: str) -> DiskUsage:
    """statvfs of `path`'s filesystem, without the fault injector (blocking: not on the loop)."""
    st = _statvfs(path)
    total = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    # f_fsid names the filesystem (BookKeeper dedups by FileStore); a few report 0: use st_dev
    fs_id = st.f_fsid or ("dev", os.stat(path).st_dev)
    return DiskUsage(total, free, (1.0 - free / total) if total else 1.0, fs_id)


def disk_space(path: str) -> DiskUsage:
    """Space of the filesystem holding `path`: the one source of every per-dir figure (the
    disk checker, the entry logger's choice of directory, GC's disks-full test), and through
    `total_space` of the bookie's free/total. An injected full disk reports itself here.
    Blocking (statvfs may hang on a sick disk): never call it on the event loop."""
    if faults is not None:
        fake = faults.space(path)
        if fake is not None:
            return fake
    return measured_space(path)


def total_space(dirs) -> DiskUsage:
    """Free and total bytes over the distinct filesystems of `dirs`, each counted once:
    BookKeeper's LedgerDirsManager getTotalFreeSpace / getTotalDiskSpace, which GetBookieInfo
    (freeDiskSpace, totalDiskSpace) and the HTTP /api/v1/bookie/info (freeSpace, totalSpace)
    both report. Blocking: run it off the event loop (asyncio.to_thread / run_blocking)."""
    seen, free, total = set(), 0, 0
    for d in dirs:
        space = disk_space(d)
        key = space.fs_id if space.fs_id is not None else ("dir", os.path.abspath(d))
        if key in seen:
            continue
        seen.add(key)
        free += space.free_bytes
        total += space.total_bytes
    return DiskUsage(total, free, (1.0 - free / total) if total else 1.0)


# The one thread that runs statvfs for the event loop (on_space_thread). A daemon, so that a
# call hung on a sick disk neither holds up the process's exit nor takes a worker of the
# default executor, which the read path uses.
_space_queue = None
_space_lock = threading.Lock()


async def on_space_thread(fn, *args):
    """`fn(*args)` (total_space, disk_space, or a function calling them) on the disk-space
    thread, awaited from the event loop. Calls run one at a time: behind a hung statvfs, later
    ones wait for it instead of each taking a thread."""
    global _space_queue
    import asyncio
    import queue

    with _space_lock:
        if _space_queue is None:
            _space_queue = queue.SimpleQueue()
            threading.Thread(target=_space_worker, args=(_space_queue,), name="bk-disk-space", daemon=True).start()
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    _space_queue.put((fn, args, loop, fut))
    return await fut


def _forget_space_thread() -> None:
    """In a forked child the thread is gone but the queue would stay: calls would wait for ever
    (the chaos runner forks its workers from a process whose bookies had started it)."""
    global _space_queue, _space_lock
    _space_queue = None
    _space_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_space_thread)


def _space_worker(q) -> None:
    while True:
        fn, args, loop, fut = q.get()
        try:
            result, error = fn(*args), None
        except BaseException as e:  # handed to the awaiting caller
            result, error = None, e
        try:
            loop.call_soon_threadsafe(_settle, fut, result, error)
        except RuntimeError:  # that loop is closed: nobody waits any more
            pass


def _settle(fut, result, error) -> None:
    if fut.done():  # the caller was cancelled
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


def check_commit(path: str) -> None:
    """bk.index calls this before an LMDB commit: an injected commit failure raises
    StorageError (DiskFullError for ENOSPC) and the transaction is aborted."""
    if faults is not None:
        try:
            faults.check("commit", path, None)
        except OSError as e:
            _raise_os(e, "committing the index in", path)


def check_read(path: str) -> None:
    """Readers of entry logs call this before a pread: an injected read error raises OSError."""
    if faults is not None:
        faults.check("read", path, None)


def _track(path: str, size: int) -> None:
    global _track_fd, _track_path
    want = os.environ.get("BK_FSYNC_TRACK_FILE")
    if not want:
        return
    with _track_lock:
        if _track_fd is None or _track_path != want:
            _track_fd = os.open(want, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            _track_path = want
        os.write(_track_fd, f"{os.path.abspath(path)}\t{size}\n".encode())


def tracking_enabled() -> bool:
    return bool(os.environ.get("BK_FSYNC_TRACK_FILE"))


def _track_event(kind: str, path: str, extra: str) -> None:
    """Log a directory event (`#D` listing, `#U` unlink, `#R` rename over) for power-loss tests."""
    want = os.environ.get("BK_FSYNC_TRACK_FILE")
    if not want:
        return
    global _track_fd, _track_path
    with _track_lock:
        if _track_fd is None or _track_path != want:
            _track_fd = os.open(want, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            _track_path = want
        os.write(_track_fd, f"#{kind}\t{os.path.abspath(path)}\t{extra}\n".encode())


def _keep_aside(kind: str, path: str) -> None:
    """Tracking only: hard-link `path` aside before it is unlinked or renamed over, so a
    power-loss test can put the old file back if its directory was not fsynced after."""
    want = os.environ.get("BK_FSYNC_TRACK_FILE")
    if not want or not os.path.isfile(path):
        return
    shadow = _shadow_path(want)
    try:
        os.link(path, shadow)
    except OSError:
        return
    _track_event(kind, path, shadow)


def _shadow_path(track_file: str) -> str:
    """A fresh name under `<track file>.shadow/` for a kept-aside file."""
    import itertools
    global _shadow_ids
    if _shadow_ids is None:
        _shadow_ids = itertools.count()
    shadow_dir = track_file + ".shadow"
    os.makedirs(shadow_dir, exist_ok=True)
    return os.path.join(shadow_dir, f"{os.getpid()}-{next(_shadow_ids)}")


def track_in_place(path: str, synced_end: int, grown_from: int = 0) -> None:
    """Tracking only: `path` is written in place (a format 2 journal file) and is durable
    as it stands now, its data up to `synced_end`. A copy is kept aside, so a power-loss
    test can put back, over any bytes written after the last fsync, what the file held
    there before (zeros, or a recycled file's old records) instead of cutting the file.
    `grown_from`: only bytes from there on are new since this process's last copy of the
    file; the copy is brought up to date there (what lies below it and past `synced_end`
    has not been made durable since that copy, so the copy still holds it)."""
    want = os.environ.get("BK_FSYNC_TRACK_FILE")
    if not want:
        return
    import shutil
    key = (want, os.path.abspath(path))
    shadow = _in_place_copies.get(key)
    if grown_from and shadow is not None and os.path.exists(shadow):
        with open(path, "rb") as src, open(shadow, "r+b") as dst:
            src.seek(grown_from)
            dst.seek(grown_from)
            shutil.copyfileobj(src, dst)
            dst.truncate(src.tell())
    else:
        shadow = _in_place_copies[key] = _shadow_path(want)
        shutil.copyfile(path, shadow)
        _track_event("P", path, shadow)
    _track(path, synced_end)


_in_place_copies: dict[tuple[str, str], str] = {}  # (track file, path) -> its copy (track_in_place)


def _track_listing(path: str) -> str | None:
    if not os.environ.get("BK_FSYNC_TRACK_FILE"):
        return None
    import json
    try:
        return json.dumps(sorted(os.listdir(path)))
    except OSError:
        return None


_shadow_ids = None


def _raise_os(e: OSError, what: str, path: str) -> None:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        raise DiskFullError(f"no space left on device while {what} {path}") from e
    raise StorageError(f"I/O error while {what} {path}: {e.strerror}") from e


def fsync_dir(path: str) -> None:
    """Make a directory's entries (new, renamed, deleted files) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if faults is not None:
            faults.check("fsync", path, None)
        listing = _track_listing(path)
        os.fsync(fd)
    except OSError as e:
        raise SyncFailedError(f"fsync of directory {path} failed: {e.strerror}; its new or removed "
                              f"entries may not be durable") from e
    finally:
        os.close(fd)
    if listing is not None:  # the entries present when the fsync began are durable
        _track_event("D", path, listing)


def ensure_dir(path: str) -> None:
    """Create `path` (and parents) and make the new entry durable in its parent."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(os.path.abspath(path))
    ensure_dir(parent)
    try:
        if faults is not None:
            faults.check("mkdir", path, None)
        os.mkdir(path)
    except FileExistsError:
        return
    if tracking_enabled():
        _track_event("D", path, "[]")  # a new directory: nothing in it durable before its fsync
    fsync_dir(parent)


class DurableFile:
    """An append-only file: write() buffers in the OS, fsync() makes it durable.

    Not thread-safe; one owner thread writes. `size` is the number of bytes
    written so far, `synced_size` the number known durable.
    """

    __slots__ = ("path", "fd", "size", "synced_size", "sync_failed", "_sync_data", "_dropped")

    def __init__(self, path: str, *, create: bool = True, sync_data: bool = True):
        self.path = path
        self.fd = -1
        self.sync_failed: SyncFailedError | None = None  # the failed fsync (fsyncgate: see module docstring)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        try:
            if create and faults is not None:
                faults.check("write", path, None)
            self.fd = os.open(path, flags, 0o644)
        except OSError as e:
            _raise_os(e, "opening", path)
        self.size = os.fstat(self.fd).st_size
        self.synced_size = self.size if not create else 0
        self._sync_data = sync_data
        self._dropped = 0  # page cache dropped below this offset (drop_synced_pages)
        if create:
            try:
                fsync_dir(os.path.dirname(os.path.abspath(path)))
                if sync_data:
                    self.fsync()
            except StorageError:
                self.close()
                raise

    def write(self, data) -> int:
        """Append all of `data` (bytes-like); returns the offset it starts at."""
        start = self.size
        view = memoryview(data)
        try:
            if faults is not None:
                faults.check("write", self.path, self)
            while view:
                n = os.pwrite(self.fd, view, self.size)
                self.size += n
                view = view[n:]
        except OSError as e:
            _raise_os(e, "writing", self.path)
        return start

    def writev(self, buffers) -> int:
        start = self.size
        try:
            if faults is not None:
                faults.check("write", self.path, self)
            total = sum(len(b) for b in buffers)
            n = os.pwritev(self.fd, buffers, self.size)
            self.size += n
            if n < total:  # short write: finish the rest the slow way
                rest = b"".join(bytes(b) for b in buffers)[n:]
                self.write(rest)
        except OSError as e:
            _raise_os(e, "writing", self.path)
        return start

    def pwrite_at(self, data, offset: int) -> None:
        """Overwrite bytes inside the file (headers); does not move `size`."""
        try:
            if faults is not None:
                faults.check("write", self.path, self)
            os.pwrite(self.fd, data, offset)
        except OSError as e:
            _raise_os(e, "writing", self.path)

    def fsync(self) -> None:
        if not self._sync_data:
            return
        if self.sync_failed is not None:
            raise SyncFailedError(f"{self.path}: an earlier fsync failed ({self.sync_failed}); "
                                  f"nothing written to it since byte {self.synced_size} can be proven durable")
        try:
            if faults is not None:
                faults.check("fsync", self.path, self)
            os.fdatasync(self.fd)
        except OSError as e:
            err = SyncFailedError(f"fsync of {self.path} failed: {e.strerror}; data written since byte "
                                  f"{self.synced_size} may be lost")
            err.__cause__ = e
            self.sync_failed = err
            raise err from e
        self.synced_size = self.size
        _track(self.path, self.size)

    def drop_synced_pages(self) -> None:
        """Let the kernel drop this file's page-cache pages below the durable size
        (POSIX_FADV_DONTNEED; BookKeeper's journalRemovePagesFromCache). Whole pages only:
        the partial last page stays cached, because the next append rewrites it. Advice
        only: a failure is ignored (nothing is lost, the pages just stay cached)."""
        end = self.synced_size & ~(PAGE_BYTES - 1)
        if end <= self._dropped:
            return
        try:
            os.posix_fadvise(self.fd, self._dropped, end - self._dropped, os.POSIX_FADV_DONTNEED)
        except (OSError, AttributeError):
            return
        self._dropped = end

    def truncate(self, size: int) -> None:
        if self.sync_failed is not None:
            raise SyncFailedError(f"{self.path}: an earlier fsync failed; not truncating it")
        try:
            if faults is not None:  # cutting a file needs no space: only the fsync can fail
                faults.check("fsync", self.path, self)
            os.ftruncate(self.fd, size)
            os.fsync(self.fd)
        except OSError as e:
            _raise_os(e, "truncating", self.path)
        self.size = size
        self.synced_size = size
        _track(self.path, size)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def atomic_write(path: str, data: bytes) -> None:
    """Replace `path` with `data` durably: temp file, fsync, rename, fsync dir."""
    tmp = path + ".tmp"
    try:
        if faults is not None:
            faults.check("write", tmp, None)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if faults is not None:
                faults.check("fsync", tmp, None)
            os.fsync(fd)
        finally:
            os.close(fd)
        if faults is not None:
            faults.check("rename", path, None)
        if tracking_enabled():
            _keep_aside("R", path)
        os.replace(tmp, path)
        fsync_dir(os.path.dirname(os.path.abspath(path)))
    except OSError as e:
        _raise_os(e, "writing", path)
    _track(path, len(data))


def remove_file(path: str) -> None:
    """Delete a file and make the deletion durable."""
    try:
        if faults is not None:
            faults.check("unlink", path, None)
        if tracking_enabled():
            _keep_aside("U", path)
        os.unlink(path)
    except FileNotFoundError:
        return
    fsync_dir(os.path.dirname(os.path.abspath(path)))
