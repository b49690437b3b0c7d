"""The client's add path alone: LedgerHandle + BookieClient against bookies that answer at once.

    pytest bench/test_bench_client.py --benchmark-only -q

What a writer process pays per add, without a bookie process competing for the
CPU: each round writes ADDS entries of 1 KiB with DEPTH in flight through the
real LedgerHandle, BookieClient, framing, digest and response decoding. The
bookies are fake transports inside the same loop: every `writelines` of ADD
frames is answered in the next loop step by one buffer of ADD responses
(encode_add_responses), as a bookie answers a journal group. So the figure is
the client's whole CPU per add (the fake bookie's part - reading the ids out of
each frame and encoding responses - is included and is small).

extra_info: `adds_per_s` and `us_per_add` from the median add window (a round
also creates and closes its ledger: that is in the round time, not here), for
E/WQ/AQ 1/1/1 and 3/2/2 (two sends and two answers per add), callback adds
(async_add_entry(data, callback)) and future adds (a sliding window of
async_add_entry futures), and for E1 the other forms of bench/forms.py, each
for FORM_ROUND_S per round: `gather` over add_entry, one `task` per add,
`batch` (add_entries), `writer` (lh.writer), and `gather-coroutine` (gather
over a coroutine around add_entry: what add_entry cost when it was a
coroutine).
"""
from __future__ import annotations

import asyncio
import statistics
import struct
import time

import pytest

from bk import eventloop
from bk.client import BookKeeper
from bk.client.bookie_client import _BookieProtocol
from bk.meta.cluster import init_new_cluster
from bk.meta.registration import RegistrationManager
from bk.meta import open_store
from bk.proto import encode_add_responses

from bench.forms import ADDERS

ADDS = 20_000
FORM_ROUND_S = 0.3
DEPTH = 1000
ENTRY = 1024
_ids = struct.Struct(">qq")
_ROUND = [0]


class InstantBookieTransport:
    """A connected transport whose bookie acknowledges every ADD in the next loop step."""

    def __init__(self, protocol: _BookieProtocol):
        self.protocol = protocol
        self.loop = asyncio.get_running_loop()
        self.rows: list = []

    def writelines(self, frames) -> None:
        rows = self.rows
        for frame in frames:  # len(4) header(4) master key(20) ledger(8) entry(8) ...
            ledger_id, entry_id = _ids.unpack_from(frame, 28)
            rows.append((0, ledger_id, entry_id))
        if len(rows) == len(frames):  # first batch of this step: answer in the next one
            self.loop.call_soon(self._answer)

    def write(self, data) -> None:
        self.writelines([data])

    def is_closing(self) -> bool:
        return False

    def _answer(self) -> None:
        rows, self.rows = self.rows, []
        self.protocol.data_received(encode_add_responses(rows))

    def get_extra_info(self, name, default=None):
        return default

    def close(self) -> None:
        pass

    abort = close


def connect_instantly(bkc: BookKeeper, bookie_ids) -> None:
    for bookie_id in bookie_ids:
        client = bkc.pool.get(bookie_id)
        protocol = _BookieProtocol(client)
        protocol.connection_made(InstantBookieTransport(protocol))
        client._core.protocol = protocol


async def write_round(ensemble: int, wq: int, aq: int, mode: str) -> tuple[int, float]:
    _ROUND[0] += 1
    uri = f"mem://bench-client-{_ROUND[0]}/ledgers"
    store = await open_store(uri)
    await init_new_cluster(store)
    bookies = [f"127.0.0.1:{3181 + i}" for i in range(ensemble)]
    registrations = []
    for b in bookies:
        rm = RegistrationManager(await open_store(uri))
        await rm.register(b)
        registrations.append(rm)
    payload = bytes(ENTRY)
    try:
        async with BookKeeper(uri) as bkc:
            connect_instantly(bkc, bookies)
            lh = await bkc.create_ledger(ensemble, wq, aq, password=b"")
            loop = asyncio.get_running_loop()
            state = {"in_flight": 0, "done": 0, "waiter": None}

            def done(entry_id, err) -> None:
                if err is not None:
                    raise err
                state["in_flight"] -= 1
                state["done"] += 1
                waiter = state["waiter"]
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)

            def done_future(fut) -> None:
                done(fut.result(), None)

            eventloop.tune_gc()  # as bench.load does after its set-up
            t0 = time.perf_counter()
            if mode in ADDERS:
                adds = await ADDERS[mode](lh, payload, DEPTH, t0 + FORM_ROUND_S)
                elapsed = time.perf_counter() - t0
                await lh.close()
                assert lh.last_add_confirmed == adds - 1
                return adds, elapsed
            use_callback = mode == "callback-window"
            issued = 0
            while issued < ADDS:
                if state["in_flight"] >= DEPTH:
                    state["waiter"] = loop.create_future()
                    await state["waiter"]
                    continue
                if use_callback:
                    lh.async_add_entry(payload, done)
                else:
                    lh.async_add_entry(payload).add_done_callback(done_future)
                state["in_flight"] += 1
                issued += 1
            while state["done"] < ADDS:
                state["waiter"] = loop.create_future()
                await state["waiter"]
            elapsed = time.perf_counter() - t0
            await lh.close()
            assert lh.last_add_confirmed == ADDS - 1
            return ADDS, elapsed
    finally:
        for rm in registrations:
            await rm.close()
            await rm.store.close()
        await store.close()


@pytest.mark.parametrize("quorum", [(1, 1, 1), (3, 2, 2)], ids=["E1", "E3-WQ2-AQ2"])
@pytest.mark.parametrize("mode", ["callback", "future"])
def test_client_add_path(benchmark, quorum, mode):
    run_mode(benchmark, quorum, {"callback": "callback-window", "future": "future-window"}[mode])


@pytest.mark.parametrize("mode", ["gather", "gather-coroutine", "task", "batch", "writer"])
def test_client_add_forms(benchmark, mode):
    run_mode(benchmark, (1, 1, 1), mode)


def run_mode(benchmark, quorum, mode: str) -> None:
    rounds: list[tuple[int, float]] = []  # the add window of each round (the round also sets up and closes a ledger)

    def one_round() -> None:
        rounds.append(eventloop.run(write_round(*quorum, mode)))

    benchmark.pedantic(one_round, rounds=5, iterations=1, warmup_rounds=1)
    us = statistics.median(elapsed / adds * 1e6 for adds, elapsed in rounds[1:])  # without the warm-up round
    benchmark.extra_info.update(adds=rounds[-1][0], entry_bytes=ENTRY, in_flight=DEPTH,
                                adds_per_s=round(1e6 / us), us_per_add=round(us, 2))
