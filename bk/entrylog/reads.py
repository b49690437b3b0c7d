"""A read of stored entries as steps, without I/O (as h11 keeps a protocol apart from its
sockets): a reader is a generator that yields what it needs done and is sent the outcome.

- `Pread(h, n, offset)`: n bytes of an entry log from offset (h: a held ReadHandle). It is
  sent the bytes read (bytes or a read-only view; short at the end of the file), or a
  StorageError is thrown into it at that point.
- `Call(fn, args)`: blocking work done whole elsewhere (a sequential read-ahead); sent
  fn's result, or its StorageError thrown in.

The checks that decide what a read answers (caches, index, ids in the record, a
compaction moving the entry) live once, in the generators (LedgerStorage.read_steps,
EntryLogger.entry_steps). Three drivers run them: `drive` here, blocking, on a read
thread; `drive_many`, a batch of reads on a read thread (their first preads together);
and the bookie's io_uring (bk.bookie.read_ring), on the event loop.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Generator, Iterable, NamedTuple

from bk.entrylog.files import read_error
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


def drive_many(readers: Iterable[Steps], pread: Callable[[Any, int, int], bytes], preads=None,
               calls: list | None = None) -> list:
    """Run many reads' steps here, blocking, in order; `readers` makes each one as it is reached
    (a read-ahead of an earlier one has run by then). As drive, but the first Pread of each
    waits and they are done together by preads([(fd, n, offset)]) -> [bytes or errno], then
    each reader goes on (drive); without `preads` each is driven alone. Returns per reader
    what it returns, or the exception it raised (never raised here)."""
    out: list = []
    waiting = []  # (index, steps, their first Pread)
    for steps in readers:
        try:
            op = next(steps)
            if preads is not None and op.__class__ is Pread:
                waiting.append((len(out), steps, op))
                out.append(None)
                continue
            out.append(drive(steps, pread, calls, op))
        except StopIteration as stop:
            out.append(stop.value)
        except Exception as e:
            out.append(e)
    if waiting:
        got = coalesced_preads(preads, [(op.h.fd, op.n, op.offset) for _, _, op in waiting])
        for (i, steps, op), data in zip(waiting, got):
            try:
                if data.__class__ is int:
                    nxt = steps.throw(read_error(op.h.path, op.offset, OSError(data, os.strerror(data))))
                else:
                    nxt = steps.send(data)
                out[i] = drive(steps, pread, calls, nxt)  # a record longer than the first pread
            except StopIteration as stop:
                out[i] = stop.value
            except Exception as e:
                out[i] = e
            finally:
                steps.close()
    return out


# A batch's first preads that lie close together in one file become one read: a ledger's
# consecutive entries are consecutive records, and the entry logs' descriptors have no kernel
# readahead (POSIX_FADV_RANDOM, bk.entrylog.files), so each small pread of a cold run was a
# trip to the disk of its own, one after the other. A merged read carries at most
# COALESCE_GAP_BYTES between two wanted spans (other ledgers' records) and COALESCE_MAX_BYTES
# in all, and only reads bytes between spans that were asked for: no read-ahead.
COALESCE_GAP_BYTES = 4096
COALESCE_MAX_BYTES = 1 << 20


def coalesced_preads(preads, reads: list) -> list:
    """preads(reads) -> per (fd, n, offset) its bytes (short at the end of the file) or errno,
    with the reads of one fd that overlap or lie within COALESCE_GAP_BYTES of each other done
    as one read and cut back into theirs (the same bytes each would have read alone). A merged
    read that fails is retried as its separate reads, so one bad span never fails its
    neighbours."""
    if len(reads) < 2:
        return preads(reads)
    groups: list[list] = []  # [fd, start, end, [indices]], in (fd, offset) order
    for i in sorted(range(len(reads)), key=lambda i: (reads[i][0], reads[i][2])):
        fd, n, offset = reads[i]
        g = groups[-1] if groups else None
        if (g is not None and g[0] == fd and offset <= g[2] + COALESCE_GAP_BYTES
                and max(g[2], offset + n) - g[1] <= COALESCE_MAX_BYTES):
            g[2] = max(g[2], offset + n)
            g[3].append(i)
        else:
            groups.append([fd, offset, offset + n, [i]])
    if len(groups) == len(reads):
        return preads(reads)
    out: list = [None] * len(reads)
    retry: list[int] = []
    for (fd, start, end, members), data in zip(groups, preads([(g[0], g[2] - g[1], g[1]) for g in groups])):
        if data.__class__ is int and len(members) > 1:
            retry.extend(members)
            continue
        for i in members:
            _, n, offset = reads[i]
            out[i] = data if data.__class__ is int else data[offset - start:offset - start + n]
    if retry:
        for i, data in zip(retry, preads([reads[i] for i in retry])):
            out[i] = data
    return out

