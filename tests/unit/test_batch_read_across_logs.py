"""BATCH_READ through a real Bookie whose ledger lies in two entry logs and the write cache.

A span (bk.entrylog.spans) covers one stretch of one entry log. An answer built from the
span alone came back short (seen by a 4.17 Java client: 6 entries of 10) when the batch ran
into a second log or the write cache; a Java bookie answers every entry up to max_count
that exists and fits max_size.
"""
import asyncio
import hashlib
import os

import pytest

from bk.bookie import Bookie
from bk.config import load_config
from bk.formats import entrylog as fmt
from bk.entrylog.spans import BufferSpan, FileSpan
from bk.proto import BatchReadRequest
from bk.server.processor import RequestProcessor

KEY = hashlib.sha1(b"ledger" + b"pw").digest()
LEDGER = 5
PAYLOAD = 8 * 1024  # 64 KiB logs hold 7 such entries


def entry(entry_id: int) -> bytes:
    payload = os.urandom(PAYLOAD)
    return (LEDGER.to_bytes(8, "big") + entry_id.to_bytes(8, "big", signed=True)
            + (-1).to_bytes(8, "big", signed=True) + len(payload).to_bytes(8, "big") + payload)


def _config(tmp_path):
    return load_config(env={}, overrides=dict(
        journal_dirs=[str(tmp_path / "journal")], ledger_dirs=[str(tmp_path / "ledgers")],
        flush_interval_ms=60_000, write_cache_max_size_bytes="4MiB", entry_log_size_limit_bytes="64KiB"))


def _items(resp) -> list[bytes]:
    """The answer's entries, a span's records parsed as the client parses the frame."""
    body = resp.entries
    if isinstance(body, (FileSpan, BufferSpan)):
        raw = body.read()
        body.release()
        out, pos = [], 0
        while pos < len(raw):
            n = int.from_bytes(raw[pos:pos + 4], "big")
            out.append(raw[pos + 4:pos + 4 + n])
            pos += 4 + n
        return out
    return list(body)


@pytest.mark.parametrize("spans", [True, False], ids=["spans", "no-spans"])
def test_batch_read_across_two_logs_and_the_write_cache_answers_every_entry(tmp_path, spans):
    async def main():
        b = Bookie(_config(tmp_path))
        await b.start()
        try:
            written = [entry(e) for e in range(14)]
            for e in range(10):
                await b.add_entry(LEDGER, e, written[e], KEY)
            await b.checkpoint()  # 0..9 in the entry logs
            for e in range(10, 14):
                await b.add_entry(LEDGER, e, written[e], KEY)  # 10..13 only in the write cache
            logs = {fmt.split_location(loc)[0] for loc in
                    b.storage.index.get_locations([(LEDGER, e) for e in range(10)])}
            assert len(logs) >= 2, "the ledger's flushed entries should lie in two entry logs"
            assert b.storage.index.get_location(LEDGER, 12) is None
            proc = RequestProcessor(b, b.config)
            for start, count in [(0, 14), (3, 10), (5, 6), (8, 5)]:
                resp = await proc.operations._batch_read_entries(BatchReadRequest(0, LEDGER, start, 1, count, 0), spans)
                assert resp.rc == 0
                assert _items(resp) == written[start:start + count], (start, count)
            # past the end: what exists, no error
            resp = await proc.operations._batch_read_entries(BatchReadRequest(0, LEDGER, 9, 1, 20, 0), spans)
            assert _items(resp) == written[9:]
            # max_size still bounds the answer: 32-byte header + 3 items of 4 + len
            size = 32 + 3 * (4 + len(written[0]))
            resp = await proc.operations._batch_read_entries(BatchReadRequest(0, LEDGER, 4, 1, 10, size), spans)
            assert _items(resp) == written[4:7]
            # every span the answers took and did not send went back: fd references, buffers
            el = b.storage.entry_logger
            assert all(h.refs == 0 for h in el._files._open.values())
            assert len(el._direct_buffers._free) == el._direct_buffers._made
        finally:
            await b.stop()
    asyncio.run(main())


class _Span:
    """A stand-in span: `count` records of the entries given, released once at most."""

    def __init__(self, entries):
        self.count = len(entries)
        self.length = sum(4 + len(e) for e in entries)
        self.released = 0

    def __len__(self):
        return self.length

    def release(self):
        self.released += 1


class _SpanBookie:
    """read_span answers the first `in_span` entries as a span; read_entry serves the list
    (NoSuchEntryError past it), or raises what `errors` holds for an entry id."""

    def __init__(self, entries, in_span, errors=None):
        self.entries, self.in_span, self.errors = entries, in_span, errors or {}
        self.spans = []

    async def read_span(self, ledger_id, entry_id, max_count, max_bytes):
        self.spans.append(_Span(self.entries[entry_id:entry_id + min(self.in_span, max_count)]))
        return self.spans[-1]

    async def read_entry(self, ledger_id, entry_id):
        from bk.errors import NoSuchEntryError
        if entry_id in self.errors:
            raise self.errors[entry_id]
        if entry_id >= len(self.entries):
            raise NoSuchEntryError(ledger_id=ledger_id, entry_id=entry_id)
        return self.entries[entry_id]


def _answer(bookie, max_count, max_size=0):
    proc = RequestProcessor(bookie, load_config(env={}, overrides={"ledger_dirs": ["/"]}))
    return asyncio.run(proc.operations._batch_read_entries(BatchReadRequest(0, LEDGER, 0, 1, max_count, max_size), True))


def test_a_short_span_is_released_and_the_answer_holds_every_entry():
    entries = [bytes([i]) * 100 for i in range(8)]
    b = _SpanBookie(entries, in_span=3)
    assert _answer(b, 6).entries == entries[:6]
    assert b.spans[0].released == 1


def test_a_span_is_the_answer_when_it_is_whole():
    entries = [bytes([i]) * 100 for i in range(8)]
    for max_count, max_size, in_span in [(3, 0, 3),  # max_count entries
                                         (6, 0, 8 - 2),  # read_span gave what it was asked
                                         (6, 32 + 3 * 104 + 50, 3)]:  # the next would not fit
        b = _SpanBookie(entries, in_span=in_span)
        resp = _answer(b, max_count, max_size)
        assert resp.entries is b.spans[0] and b.spans[0].released == 0
    b = _SpanBookie(entries[:3], in_span=3)  # the next does not exist
    assert _answer(b, 6).entries is b.spans[0]


def test_after_a_span_a_later_error_ends_the_batch_and_any_other_releases_the_span():
    from bk.errors import CorruptedStorageError
    entries = [bytes([i]) * 100 for i in range(8)]
    b = _SpanBookie(entries, in_span=3, errors={3: CorruptedStorageError("bad record")})
    resp = _answer(b, 6)
    assert resp.entries is b.spans[0] and b.spans[0].released == 0  # entries 0..2; 3 read elsewhere
    b = _SpanBookie(entries, in_span=3, errors={3: RuntimeError("boom")})
    with pytest.raises(RuntimeError):
        _answer(b, 6)
    assert b.spans[0].released == 1
