"""Format 2 journal files, written in place (STORAGE.md, "Journal files").

Why. Appending to a file makes every group's fdatasync commit the new file size
(and block allocation) through the file system's own journal as well as the
data; writing into blocks that already exist and hold zeros commits data only
(the raw-disk model measured p99 1.2-1.6 ms appending against 0.88-1.08 ms
writing into a pre-zeroed file, during a checkpoint's writes). So, as
BookKeeper's JournalChannel: a file is extended in big steps
(`journal_pre_alloc_size_mb`), every group is padded to `journal_alignment_size`,
and (`journal_reuse_files`) a file behind the checkpoint is recycled as a later
one instead of deleted.

Invariants.
- Zeros written for a step are fsynced before any record is written into them,
  so a group's fdatasync never has a size or an allocation to commit.
- A recycled file gets its new header under a temporary name, fsynced, and only
  then its `<id>.txn` name (directory fsynced): a crash leaves either no file of
  that id or one whose header names it. Its old records stay behind the header;
  they fail the CRC under the new file's seed (records.file_seed), so they end
  replay like zeros would (the hard case of tests/unit/test_journal_inplace.py).
- A file is closed for good (rotation, or replay of a crashed bookie's last file)
  with a FILE_END record made durable BEFORE a later file exists: replay of a
  file that is not the last one then knows where its data ends, and anything
  else stopping it there is corruption.
"""
from __future__ import annotations

import logging
import os

from bk import fileio
from bk.errors import StorageError
from bk.fileio import DurableFile, fsync_dir, remove_file
from bk.journal.records import (
    FILE_END,
    FILLER_BYTES,
    PADDING,
    current_dir,
    encode_header_v2,
    file_path,
    filler_body,
)

logger = logging.getLogger(__name__)

FREE_SUFFIX = ".free"  # a journal file behind the checkpoint, kept to be recycled
NEW_SUFFIX = ".txn.new"  # a recycled file getting its new header (not yet a journal file)
MAX_FREE_FILES = 2  # recycled files kept beyond that are deleted
ZERO_AHEAD_BYTES = 256 * 1024  # zeros written (and fsynced) at a time while the writer is idle
_ZERO_CHUNK = bytes(1 << 20)


def padding_for(end: int, alignment: int, frame, seed: int) -> bytes:
    """The PADDING record that moves a group ending at `end` to the next alignment
    boundary (b"" when it is on one). A gap smaller than a filler record takes the
    boundary after the next."""
    gap = -end % alignment
    if gap == 0:
        return b""
    if gap < FILLER_BYTES:
        gap += alignment
    return frame([filler_body(PADDING, gap)], seed)


def file_end_record(frame, seed: int) -> bytes:
    return frame([filler_body(FILE_END, FILLER_BYTES)], seed)


def prepare_group(f: DurableFile, buffers: list, group_bytes: int, alignment: int, alloc_end: int,
                  prealloc_bytes: int, frame, seed: int) -> tuple[list, int]:
    """A group's buffers with its PADDING record, and the allocated end once the space it
    goes to is zeroed and durable (whole steps taken now when the idle zeroing fell behind)."""
    pad = padding_for(f.size + group_bytes, alignment, frame, seed)
    if pad:
        buffers = buffers + [pad]
    end = f.size + group_bytes + len(pad)
    if end > alloc_end:
        step = -(-(end - alloc_end) // prealloc_bytes) * prealloc_bytes
        alloc_end = extend(f, alloc_end, alloc_end + step)
    return buffers, alloc_end


def zero_ahead(f: DurableFile, alloc_end: int, prealloc_bytes: int) -> int:
    """While less than a whole step lies zeroed ahead of the write position, zero one more
    ZERO_AHEAD_BYTES piece (the writer calls this when idle: a group then seldom waits for
    a step's zeros and fsync, tens of ms for 16 MiB; records that come meanwhile wait for
    one small piece at most). Returns the new allocated end. A failure is left to the next
    group, which meets it again and fails as it should."""
    if alloc_end - f.size >= prealloc_bytes:
        return alloc_end
    try:
        return extend(f, alloc_end, alloc_end + ZERO_AHEAD_BYTES)
    except StorageError as e:
        logger.warning("journal: cannot zero ahead in %s: %s", f.path, e)
        return alloc_end


def end_file(f: DurableFile, frame, seed: int) -> None:
    """Write FILE_END at the write position and fsync it: replay of `f` stops exactly here."""
    f.write(file_end_record(frame, seed))
    f.fsync()


def close_cleanly(f: DurableFile, frame, seed: int) -> None:
    """A clean stop ends the file (the next start writes a later one); if that fails,
    replay finds the zeroed or stale tail instead, as after a crash."""
    try:
        end_file(f, frame, seed)
    except StorageError as e:
        logger.warning("journal: cannot end %s cleanly: %s", f.path, e)


def free_files(journal_dir: str) -> list[str]:
    """Paths of files that may be recycled (kept by gc, or a reuse a crash interrupted)."""
    cur = current_dir(journal_dir)
    try:
        names = os.listdir(cur)
    except FileNotFoundError:
        return []
    return sorted(os.path.join(cur, n) for n in names if n.endswith(FREE_SUFFIX) or n.endswith(NEW_SUFFIX))


def retire(journal_dir: str, path: str, file_id: int) -> None:
    """gc with journal_reuse_files: keep the file for recycling (or delete it when
    MAX_FREE_FILES are kept already). Its old name goes away durably either way."""
    if len(free_files(journal_dir)) >= MAX_FREE_FILES:
        remove_file(path)
        return
    free = os.path.join(current_dir(journal_dir), f"{file_id:x}{FREE_SUFFIX}")
    try:
        os.rename(path, free)
    except OSError as e:
        raise StorageError(f"cannot keep journal file {path} for reuse: {e.strerror}") from e
    fsync_dir(current_dir(journal_dir))


def open_file(journal_dir: str, file_id: int, alignment: int, prealloc_bytes: int, *,
              reuse: bool, sync_data: bool) -> tuple[DurableFile, int]:
    """Create (or recycle) format 2 file `file_id`, its header durable and its first
    preallocation step zeroed and durable: (file positioned after the header, end of
    the allocated space)."""
    path = file_path(journal_dir, file_id)
    old = free_files(journal_dir) if reuse else []
    if old:
        return _recycle(old[0], path, file_id, alignment, prealloc_bytes, sync_data)
    f = DurableFile(path, create=True, sync_data=sync_data)
    try:
        f.write(encode_header_v2(file_id, alignment))
        end = extend(f, alignment, alignment + prealloc_bytes)
    except StorageError:
        f.close()
        remove_unfinished(path, journal_dir)
        raise
    return f, end


def _recycle(old: str, path: str, file_id: int, alignment: int, prealloc_bytes: int,
             sync_data: bool) -> tuple[DurableFile, int]:
    tmp = path[:-len(".txn")] + NEW_SUFFIX
    try:
        os.rename(old, tmp)
    except OSError as e:
        raise StorageError(f"cannot recycle journal file {old}: {e.strerror}") from e
    f = DurableFile(tmp, create=False, sync_data=sync_data)
    try:
        allocated = f.size
        f.pwrite_at(encode_header_v2(file_id, alignment), 0)
        f.size = alignment
        if allocated < alignment + prealloc_bytes:
            allocated = extend(f, max(allocated, alignment), alignment + prealloc_bytes)
        else:
            f.fsync()
        try:
            os.rename(tmp, path)
        except OSError as e:
            raise StorageError(f"cannot rename recycled journal file {tmp} to {path}: {e.strerror}") from e
        fsync_dir(os.path.dirname(path))
    except StorageError:
        f.close()
        raise
    f.path = path
    fileio.track_in_place(path, f.size)
    logger.info("journal: recycled %s as %s", old, path)
    return f, allocated


def extend(f: DurableFile, start: int, end: int) -> int:
    """Write zeros into [start, end) of `f` and fsync them (with whatever is written
    before `start`); returns `end`. `f.size` (the write position) does not move."""
    pos = start
    while pos < end:
        n = min(len(_ZERO_CHUNK), end - pos)
        f.pwrite_at(_ZERO_CHUNK if n == len(_ZERO_CHUNK) else _ZERO_CHUNK[:n], pos)
        pos += n
    f.fsync()
    fileio.track_in_place(f.path, f.size, grown_from=start)
    return end


def remove_unfinished(path: str, journal_dir: str) -> None:
    """Remove a journal file whose creation failed: a header-less newest file would stop replay."""
    if os.path.exists(path):
        try:
            remove_file(path)
        except (OSError, StorageError) as e:
            logger.error("journal %s: cannot remove the unfinished file %s: %s", journal_dir, path, e)
