"""The long-polls scenario of bench.overload (docs/OVERLOAD.md, issue 27).

`--long-polls` v3 long polls (READ, previousLAC = the ledger's LAC, ENTRY_PIGGYBACK,
timeOut 60 s) over `--long-poll-connections` connections sit parked while the bookie's
CPU seconds (/proc, every thread: bench.procmem.read_cpu_s) are measured over
`--long-poll-idle-s`, against the same interval with none parked; then one add moves the
LAC and every long poll must be answered with the new LAC and the entry after the old one.
Memory per parked long poll = (RssAnon with them - RssAnon before) / count.
"""
from __future__ import annotations

import asyncio
import random
import struct
import time

from bk.proto import AddRequest, FrameDecoder, StatusCode, encode_request
from bk.proto import v3

from .overload import _ENTRY_HEADER, KEY, KiB, Measured, Target, anon_bytes, good_client, raise_nofile
from .procmem import read_cpu_s

LONG_POLL_BUDGET_BYTES = 4 * KiB  # one parked long poll: its v3 Request, watcher, timer (measured: docs/OVERLOAD.md)
LONG_POLL_TIMEOUT_MS = 60_000  # the most a bookie waits (bk.server.v3.LONG_POLL_MAX_S)


def long_poll_frame(txn_id: int, ledger_id: int, previous_lac: int, timeout_ms: int) -> bytes:
    req = v3.Request()
    req.header.version, req.header.operation, req.header.txnId = 3, v3.OperationType.READ_ENTRY, txn_id
    r = req.readRequest
    r.ledgerId, r.entryId, r.previousLAC, r.timeOut = ledger_id, -1, previous_lac, timeout_ms
    r.flag = v3.READ_FLAG_ENTRY_PIGGYBACK
    return v3.frame(req)


async def _parked_polls(port: int, ledger_id: int, first_txn: int, count: int, answers: list) -> asyncio.StreamWriter:
    """One v3 connection sending `count` long polls; its answers are appended to `answers`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"".join(long_poll_frame(first_txn + i, ledger_id, 1, LONG_POLL_TIMEOUT_MS) for i in range(count)))
    await writer.drain()

    async def read_answers():
        buf = b""
        while True:
            chunk = await reader.read(1 << 16)
            if not chunk:
                return
            buf += chunk
            while len(buf) >= 4:
                n = struct.unpack_from(">I", buf)[0]
                if len(buf) < 4 + n:
                    break
                answers.append(v3.parse(v3.Response, buf[4:4 + n]))
                buf = buf[4 + n:]
    writer.reader_task = asyncio.ensure_future(read_answers())
    return writer


async def _add_raw(port: int, ledger_id: int, entry_id: int, lac: int, block: bytes) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        body = _ENTRY_HEADER.pack(ledger_id, entry_id, lac) + block
        writer.write(encode_request(AddRequest(0, KEY, ledger_id, entry_id, body)))
        decoder = FrameDecoder()
        while True:
            got = decoder.feed_responses(await asyncio.wait_for(reader.read(1 << 16), 30))
            if got:
                return got[0].rc
    finally:
        writer.close()


async def cpu_seconds_over(pid: int, seconds: float) -> float:
    before = read_cpu_s(pid)
    await asyncio.sleep(seconds)
    return round(read_cpu_s(pid) - before, 3)


async def long_polls(target: Target, count: int, connections: int, idle_s: float) -> dict:
    raise_nofile()
    await good_client(target.uri, seed=11)
    ledger_id = 3_000_000 + random.Random().randrange(1_000_000)
    block = random.Random(12).randbytes(100)
    for e, lac in ((0, -1), (1, 0), (2, 1)):  # the bookie's LAC of the ledger: 1
        if await _add_raw(target.port, ledger_id, e, lac, block) != StatusCode.EOK:
            raise AssertionError("the long polls' ledger could not be written")
    m = await Measured.start(target)
    cpu_idle = await cpu_seconds_over(target.pid, idle_s)  # the bookie with nothing parked
    answers: list = []
    per = -(-count // connections)
    writers = [await _parked_polls(target.port, ledger_id, i * per, min(per, count - i * per), answers)
               for i in range(connections) if count - i * per > 0]
    await asyncio.sleep(2.0)  # every request read and parked
    early = len(answers)
    anon_parked = anon_bytes(target.pid)
    cpu_parked = await cpu_seconds_over(target.pid, idle_s)
    woke_at = time.monotonic()
    if await _add_raw(target.port, ledger_id, 3, 2, block) != StatusCode.EOK:  # LAC 1 -> 2
        raise AssertionError("the add that moves the LAC failed")
    deadline = woke_at + 30
    while len(answers) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    answered_s = round(time.monotonic() - woke_at, 3)
    wanted = _ENTRY_HEADER.pack(ledger_id, 2, 1) + block
    good = sum(1 for a in answers if a.status == 0 and a.readResponse.maxLAC == 2
               and a.readResponse.entryId == 2 and a.readResponse.body == wanted)
    refused = sum(1 for a in answers if a.status != 0)
    for w in writers:
        w.reader_task.cancel()
        w.close()
    return await m.result(count * LONG_POLL_BUDGET_BYTES, long_polls=count, connections=len(writers),
                          idle_s=idle_s, cpu_s_idle_without=cpu_idle, cpu_s_idle_with_parked=cpu_parked,
                          answered_before_the_lac_moved=early, answered=len(answers), answered_correctly=good,
                          answered_with_an_error=refused, all_answered_within_s=answered_s,
                          bytes_per_parked_long_poll=int((anon_parked - m.anon_before) / max(1, count)))
