"""EntryLogger.read_span: a BATCH_READ answer's entries as the entry log lays them out.

An entry log's records (`size | entry`) are the answer's items (`length | entry`) byte for
byte, so a run of one ledger's consecutive entries stored back to back is sent as it lies:
a FileSpan (os.sendfile from the page cache) when the first page is cached, a BufferSpan
(an O_DIRECT read into a reused buffer) when it is not. Both paths are checked here the
same way: the bytes, where the span stops, the errors, and that every reference and
buffer goes back.
"""
import os
import struct
import time

import pytest

from bk.entrylog import EntryLogger
from bk.entrylog import spans as spans_mod
from bk.formats import entrylog as fmt
from bk.entrylog.spans import BufferSpan, FileSpan
from bk.errors import CorruptedStorageError

from bk.config import BookieConfig, load_config

KiB = 1024
MiB = 1024 * KiB


def cfg(**kw) -> BookieConfig:
    return load_config(env={}, overrides=kw)


def entry(ledger_id: int, entry_id: int, payload_len: int) -> bytes:
    return struct.pack(">qq", ledger_id, entry_id) + os.urandom(payload_len)


def _items(entries) -> bytes:
    return b"".join(struct.pack(">I", len(e)) + e for e in entries)


@pytest.fixture(params=["page-cache", "direct"])
def path_kind(request, monkeypatch):
    """Which way read_span reads: the first page cached (FileSpan) or not (BufferSpan)."""
    monkeypatch.setattr(spans_mod, "_page_cached", lambda fd, offset: request.param == "page-cache")
    return request.param


def _logger(tmp_path, **kw):
    if not _direct_ok(tmp_path):  # a tmpfs /tmp: the direct path would go untested, silently
        pytest.fail(f"{tmp_path} refuses O_DIRECT: run pytest with --basetemp on a disk")
    kw.setdefault("entry_log_size_limit_bytes", 8 * MiB)
    return EntryLogger([str(tmp_path)], cfg(**kw))


def _direct_ok(path) -> bool:
    probe = os.path.join(str(path), ".direct-probe")
    with open(probe, "wb") as fh:
        fh.write(bytes(4096))
    try:
        os.close(os.open(probe, os.O_RDONLY | os.O_DIRECT))
        return True
    except OSError:
        return False
    finally:
        os.remove(probe)


def _stored(el, entries) -> list:
    locs = el.add_entries(entries)
    el.flush()
    return locs


def _served(el, *args) -> tuple[int, bytes]:
    """read_span's count and bytes; the span released."""
    span = el.read_span(*args)
    try:
        return span.count, span.read()
    finally:
        span.release()


def _span_type(kind):
    return FileSpan if kind == "page-cache" else BufferSpan


def _all_back(el) -> None:
    assert all(h.refs == 0 for h in el._files._open.values())
    pool = el._direct_buffers
    assert len(pool._free) == pool._made


@pytest.mark.parametrize("size", [0, 100, 5000, 64 * KiB])
def test_a_span_is_the_records_as_the_answer_lays_them_out(tmp_path, path_kind, size):
    el = _logger(tmp_path)
    es = [entry(3, i, size) for i in range(12)]
    locs = _stored(el, es)
    span = el.read_span(3, 0, locs, 16 * MiB)
    assert type(span) is _span_type(path_kind)
    assert span.count == 12 and len(span) == len(_items(es))
    assert span.read() == _items(es)
    span.release()
    span.release()  # once only
    # from the middle, and fewer locations than stored
    assert _served(el, 3, 5, locs[5:9], 16 * MiB) == (4, _items(es[5:9]))
    _all_back(el)
    el.close()


def test_a_span_stops_where_the_next_entry_is_not_the_next_record(tmp_path, path_kind):
    el = _logger(tmp_path)
    es = [entry(1, 0, 300), entry(1, 1, 300), entry(2, 0, 300), entry(1, 2, 300), entry(1, 3, 300)]
    loc = _stored(el, es)
    # ledger 1: entry 2 is stored after another ledger's record
    assert _served(el, 1, 0, [loc[0], loc[1], loc[3], loc[4]], MiB) == (2, _items(es[:2]))
    # not stored (None) ends it too
    assert _served(el, 1, 2, [loc[3], None], MiB) == (1, _items(es[3:4]))
    # the index places entry 1 right after entry 0, but the record there is ledger 2's: a bad
    # later record only ends the span (the read that asks for it next gets the error)
    span = el.read_span(2, 0, [loc[2], loc[3]], MiB)
    assert span.count == 1
    span.release()
    assert el.read_span(1, 0, [None, loc[1]], MiB) is None
    # a record with the right ids that the index does not place there (a stale copy) is not
    # served: only what the index places exactly here
    copies = [entry(9, 0, 300), entry(9, 1, 300), entry(9, 1, 300)]
    cl = _stored(el, copies)
    assert _served(el, 9, 0, [cl[0], cl[2]], MiB) == (1, _items(copies[:1]))
    _all_back(el)
    el.close()


def test_a_span_keeps_within_max_bytes_but_holds_one_record_at_least(tmp_path, path_kind):
    el = _logger(tmp_path)
    es = [entry(4, i, 10 * KiB) for i in range(10)]
    locs = _stored(el, es)
    one = 4 + len(es[0])
    assert _served(el, 4, 0, locs, 3 * one + one // 2) == (3, _items(es[:3]))
    assert _served(el, 4, 0, locs, 10) == (1, _items(es[:1]))
    _all_back(el)
    el.close()


def test_a_bad_first_record_is_an_error_not_an_empty_answer(tmp_path, path_kind):
    el = _logger(tmp_path)
    es = [entry(5, i, 200) for i in range(4)]
    locs = _stored(el, es)
    with pytest.raises(CorruptedStorageError, match="expected ledger 5 entry 0"):
        el.read_span(5, 0, [locs[1]], MiB)  # the index points at another entry's record
    log_id, _ = fmt.split_location(locs[0])
    with pytest.raises(CorruptedStorageError, match="header"):
        el.read_span(5, 0, [fmt.make_location(log_id, 8)], MiB)
    # a size field destroyed on disk
    path = el.log_path(log_id)
    with open(path, "r+b") as fh:
        fh.seek(fmt.split_location(locs[2])[1])
        fh.write(struct.pack(">I", 3))
    os.posix_fadvise(os.open(path, os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED)
    with pytest.raises(CorruptedStorageError, match="size 3 out of range"):
        el.read_span(5, 2, locs[2:], MiB)
    span = el.read_span(5, 0, locs, MiB)  # ends before the damaged record
    assert span.count == 2 and span.read() == _items(es[:2])
    span.release()
    _all_back(el)
    el.close()


def test_the_direct_path_steps_aside_when_it_cannot_serve(tmp_path, monkeypatch):
    monkeypatch.setattr(spans_mod, "_page_cached", lambda fd, offset: False)
    el = _logger(tmp_path, num_read_worker_threads=1)  # two buffers
    es = [entry(6, i, 1000) for i in range(8)]
    locs = _stored(el, es)
    held = [el.read_span(6, i, locs[i:i + 1], MiB) for i in range(2)]
    assert [type(s) for s in held] == [BufferSpan, BufferSpan]
    third = el.read_span(6, 2, locs[2:], MiB)  # every buffer lent: the page cache serves
    assert type(third) is FileSpan and third.read() == _items(es[2:])
    for s in held + [third]:
        s.release()
    # a file system that refuses O_DIRECT (tmpfs)
    monkeypatch.setattr(el._files, "direct_fd", lambda h: -1)
    span = el.read_span(6, 0, locs, MiB)
    assert type(span) is FileSpan and span.read() == _items(es)
    span.release()
    _all_back(el)
    el.close()


def test_a_record_longer_than_the_guess_is_read_whole(tmp_path, path_kind):
    el = _logger(tmp_path)
    small = [entry(7, i, 100) for i in range(3)]
    big = entry(7, 3, 300 * KiB)
    locs = _stored(el, small + [big])
    span = el.read_span(7, 0, locs[:1], MiB)  # remembers ~100-byte records
    span.release()
    assert _served(el, 7, 3, locs[3:], MiB) == (1, _items([big]))
    _all_back(el)
    el.close()


def test_a_ledger_not_read_before_is_read_for_what_its_locations_say(tmp_path, monkeypatch):
    """With no record size remembered the direct read takes the run's size from the distance
    between its first two locations (not max_bytes); a lone first entry reads a page and, when
    its record is longer, the page-cache path serves it whole."""
    monkeypatch.setattr(spans_mod, "_page_cached", lambda fd, offset: False)
    reads = []
    real_preadv = os.preadv
    monkeypatch.setattr(spans_mod.os, "preadv", lambda fd, bufs, off, *f: reads.append(len(bufs[0])) or
                        real_preadv(fd, bufs, off, *f))
    el = _logger(tmp_path)
    es = [entry(8, i, 100 * KiB) for i in range(6)]
    locs = _stored(el, es)
    el._record_sizes.clear()
    span = el.read_span(8, 0, locs[:1], 16 * MiB)
    assert type(span) is FileSpan and span.read() == _items(es[:1])
    assert len(reads) == 1 and reads[0] <= 2 * 4096  # a page from the record on, aligned
    span.release()
    el._record_sizes.clear()
    reads.clear()
    span = el.read_span(8, 1, locs[1:4], 16 * MiB)
    assert type(span) is BufferSpan and span.count == 3 and span.read() == _items(es[1:4])
    assert 3 * (4 + len(es[0])) <= reads[0] < 3 * (4 + len(es[0])) + 2 * 4096
    span.release()
    _all_back(el)
    el.close()


def test_asking_whether_a_page_is_cached_does_not_read_it(tmp_path):
    """The probe read_span uses to choose O_DIRECT must not read the page itself: preadv2 with
    RWF_NOWAIT answered "not cached" but started reading it, a second disk request per cold read."""
    path = str(tmp_path / "probe")
    with open(path, "wb") as fh:
        fh.write(os.urandom(64 * KiB))
        fh.flush()
        os.fsync(fh.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert spans_mod._cachestat is not None, "cachestat(2) is missing: the probe reads what it asks about"
        for _ in range(3):
            assert not spans_mod._page_cached(fd, 8 * KiB)
            time.sleep(0.05)  # a read the probe started would have landed by now
        os.pread(fd, 1, 8 * KiB)
        assert spans_mod._page_cached(fd, 8 * KiB) and not spans_mod._page_cached(fd, 32 * KiB)
    finally:
        os.close(fd)
