"""A read of stored entries as steps, without I/O (as h11 keeps a protocol apart from its
sockets): a reader is a generator that yields what it needs done and is sent the outcome.

- `Pread(h, n, offset)`: n bytes of an entry log from offset (h: a held ReadHandle). It is
  sent the bytes read (bytes or a read-only view; short at the end of the file), or a
  StorageError is thrown into it at that point.
- `Call(fn, args)`: blocking work done whole elsewhere (a sequential read-ahead); sent
  fn's result, or its StorageError thrown in.

The checks that decide what a read answers (caches, index, ids in the record, a
compaction moving the entry) live once, in the generators (LedgerStorage.read_steps,
EntryLogger.entry_steps). Two drivers run them: `drive` here, blocking, on a read
thread; and the bookie's io_uring (bk.bookie.read_ring), on the event loop.
"""
from __future__ import annotations

from typing import Any, Callable, Generator, NamedTuple

from bk.errors import StorageError


class Pread(NamedTuple):
    h: Any  # bk.entrylog.files.ReadHandle, held by the reader until it is sent the bytes
    n: int
    offset: int


class Call(NamedTuple):
    fn: Callable
    args: tuple


Steps = Generator["Pread | Call", Any, Any]


def drive(steps: Steps, pread: Callable[[Any, int, int], bytes], calls: list | None = None, op=None):
    """Run a read's steps here, blocking: each Pread with pread(h, n, offset), each Call by
    calling it (and appended to `calls` if given); `op`: the steps' next op when the caller
    advanced them already. Returns what the reader returns."""
    try:
        if op is None:
            op = next(steps)
        while True:
            try:
                if op.__class__ is Pread:
                    out = pread(*op)
                else:
                    if calls is not None:
                        calls.append(op)
                    out = op.fn(*op.args)
            except StorageError as e:
                op = steps.throw(e)
            else:
                op = steps.send(out)
    except StopIteration as stop:
        return stop.value
    finally:
        steps.close()  # an error other than StorageError: its held file goes back now
