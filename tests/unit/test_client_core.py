"""The client's add path core: the compiled `bk/client/_core.pyx` against its pure twin `core_py.py`.

Both are driven by the same random script - adds (callback and future), answers in and out of
order, errors, bookies failing and coming back, ensemble changes freezing completions, refusals -
through their declared fields and hooks only, the way LedgerHandle and BookieClient hold them.
Every observable thing is recorded (frames written, hook calls with their arguments, completions in
order, the fields at the end) and the two traces must be equal; the pure twin's trace is also checked
against the invariants the cores promise (in-order completion, exactly once, AQ acks under the
current ensemble).
"""
from __future__ import annotations

import random
from collections import deque

import pytest

from bk._native import load_native, load_pure
from bk.errors import IncorrectParameterError, LedgerClosedError
from bk.proto.messages import AddResponse, ReadResponse

PURE = load_pure("core", "bk.client")
NATIVE = load_native("core", "bk.client")
needs_native = pytest.mark.skipif(NATIVE is None, reason="native client core not built")
CORES = [pytest.param(PURE, id="pure"), pytest.param(NATIVE, id="native", marks=needs_native)]
LEDGER = 7


def declared_fields(cls) -> set[str]:
    """The fields a class declares: a compiled class's public C fields, a pure class's __slots__."""
    if "__slots__" in vars(cls):
        return set(cls.__slots__)
    return {name for name, v in vars(cls).items() if type(v).__name__ == "getset_descriptor"}


@needs_native
@pytest.mark.parametrize("name", ["AddCore", "RequestCore", "AddBatch", "AddWindow"])
def test_both_twins_declare_the_same_fields(name):
    assert declared_fields(getattr(NATIVE, name)) == declared_fields(getattr(PURE, name))


@needs_native
@pytest.mark.parametrize("name", ["AddCore", "RequestCore", "PendingAdd", "AddBatch", "AddWindow", "Ready"])
def test_both_twins_have_the_same_methods(name):
    def methods(cls):
        return {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}
    assert methods(getattr(NATIVE, name)) == methods(getattr(PURE, name))


class Future:
    """Enough of asyncio.Future for the core (it only completes futures)."""

    def __init__(self):
        self.outcome = None

    def done(self):
        return self.outcome is not None

    def set_result(self, value):
        assert self.outcome is None
        self.outcome = ("ok", value)

    def set_exception(self, err):
        assert self.outcome is None
        self.outcome = ("err", repr(err), getattr(err, "acknowledged", None), getattr(err, "failed", None),
                        getattr(err, "not_added", None))


class Loop:
    def __init__(self):
        self.soon = deque()

    def create_future(self):
        return Future()

    def call_soon(self, fn, *args):
        self.soon.append((fn, args))

    def time(self):
        return 100.0

    def run_soon(self):
        while self.soon:
            fn, args = self.soon.popleft()
            fn(*args)


class Handle:
    def cancel(self):
        pass


class Transport:
    def __init__(self, trace, bookie):
        self.trace, self.bookie = trace, bookie

    def writelines(self, frames):
        self.trace.append(("write", self.bookie, [bytes(f) for f in frames]))

    def is_closing(self):
        return False


class Protocol:
    def __init__(self, trace, bookie):
        self.transport = Transport(trace, bookie)


class Framer:
    def frame(self, entry_id, lac, length, data):
        return b"%d:%d:%d:" % (entry_id, lac, length) + bytes(data)


class Client:
    closed = False


class Harness:
    """One ledger's AddCore and its bookies' RequestCores, built from one core module."""

    def __init__(self, mod, e: int, wq: int, aq: int):
        self.mod = mod
        self.trace: list = []
        self.loop = Loop()
        self.bk = Client()
        self.bookies = [f"b{i}" for i in range(e)]
        self.requests = {}
        for b in self.bookies:
            self.requests[b] = self._request_core(b)
        core = self.core = mod.AddCore(
            LEDGER, self.bk, self.loop, raise_refused=self._raise_refused, raise_too_large=self._too_large,
            send_again=self._send_again, add_failure=self._add_failure, wake_drain=self._wake_drain)
        core.framer = Framer()
        core.max_payload_bytes = 64
        core.ensemble_size, core.write_quorum_size, core.ack_quorum_size = e, wq, aq
        core.index = {b: i for i, b in enumerate(self.bookies)}
        core.write_set_indexes = [tuple((r + i) % e for i in range(wq)) for r in range(e)]
        self.responders = [(self.requests[b], mod.AddResponder(core, b)) for b in self.bookies]
        core.write_sets = [tuple(self.responders[i] for i in idx) for idx in core.write_set_indexes]
        core.pending = deque()
        core.failed_bookies = set()
        core.lac = core.last_add_pushed = -1
        self.window = mod.AddWindow(core, 3)

    def _request_core(self, bookie):
        trace = self.trace

        def hook(name):
            def called(*args):
                trace.append((name, bookie) + tuple(repr(a) if name == "queue" else a for a in args
                                                    if not callable(a)))
            return called

        def key_for(protocol, msg):
            trace.append(("key_for", bookie, msg))
            return ("read", msg.ledger_id, msg.entry_id)

        core = self.mod.RequestCore(bookie, self.loop, 10.0, 5.0, refuse_closed=hook("refuse_closed"),
                                    queue=hook("queue"), arm_sweep=lambda: setattr(core, "sweep_handle", Handle()),
                                    start_connect=hook("start_connect"), key_for=key_for, promote=hook("promote"))
        core.protocol = Protocol(trace, bookie)
        return core

    # LedgerHandle's hooks, reduced to what the script needs
    def _raise_refused(self):
        self.trace.append(("raise_refused",))
        raise LedgerClosedError("refused")

    def _too_large(self, n):
        self.trace.append(("too_large", n))
        raise IncorrectParameterError(f"{n} bytes")

    def _send_again(self, op, indexes):
        self.trace.append(("send_again", op.entry_id, tuple(indexes)))
        op.sent = True
        for i in indexes:
            if self.bookies[i] not in self.core.failed_bookies:
                client, respond = self.responders[i]
                client.send_add(op.frame, LEDGER, op.entry_id, respond)

    def _add_failure(self, bookie, response, err):
        self.trace.append(("add_failure", bookie, response, repr(err)))
        self.core.failed_bookies.add(bookie)
        self.core.changing = True

    def _wake_drain(self):
        self.trace.append(("wake_drain",))

    def done(self, entry_id, err):
        self.trace.append(("callback", entry_id, repr(err)))

    # the script's steps
    def add(self, rng):
        payloads = [b"", b"x", b"y" * 10, bytearray(b"ba"), memoryview(b"mv"), b"z" * 65, "str"]
        data = rng.choice(payloads)
        how = rng.random()
        try:
            if how < 0.3:
                result = self.core.async_add_entry(data, self.done)
            elif how < 0.45:
                self.futures.append(self.core.async_add_entry(data))
                result = "future"
            elif how < 0.6:  # never raises: a refused add is a failed future
                self.futures.append(self.core.add_entry(data))
                result = "future"
            elif how < 0.7:
                batch = [rng.choice(payloads[:5]) for _ in range(rng.randrange(4))]
                if rng.random() < 0.1:
                    batch.append(rng.choice(payloads[5:]))  # bad input: nothing of the batch is added
                self.futures.append(self.core.add_entries(iter(batch)))
                result = "batch"
            else:
                awaitable = self.window.add(data)
                if isinstance(awaitable, Future):
                    self.futures.append(awaitable)
                    result = "waits"
                else:
                    try:
                        awaitable.__await__().__next__()
                    except StopIteration as stop:
                        result = ("ready", stop.value)
            self.trace.append(("added", result))
        except Exception as e:  # noqa: BLE001 - the error is part of the trace
            self.trace.append(("add raised", type(e).__name__))

    def answer(self, rng):
        requests = [(b, key) for b, rc in self.requests.items() for key in rc.pending]
        if not requests:
            return
        bookie, key = rng.choice(requests)
        rc = rng.choice([0] * 30 + [-1, 101])
        msg = AddResponse(rc, key[1], key[2]) if rc != -1 else ReadResponse(0, LEDGER, key[2], b"")
        client = self.requests[bookie]
        client.dispatch_all(client.protocol, [msg])

    def heal(self, rng):
        """The ensemble change is in the metadata: the failed bookies are back, their acks forgotten."""
        core = self.core
        if not core.changing:
            return
        for b in sorted(core.failed_bookies):
            i = core.index[b]
            for op in list(core.pending):
                if i in core.write_set_indexes[op.entry_id % core.ensemble_size]:
                    op.unack(i)
                    self._send_again(op, (i,))
        core.failed_bookies.clear()
        core.changing = False
        core.deliver()

    def fields(self):
        core = self.core
        names = sorted(declared_fields(type(core)) - {"raise_refused", "raise_too_large", "send_again",
                                                        "add_failure", "wake_drain", "bk", "loop", "framer",
                                                        "write_sets", "pending"})
        state = {n: getattr(core, n) for n in names}
        state["pending"] = [(op.entry_id, op.length, op.ack_count, op.acked, op.sent) for op in core.pending]
        w = self.window
        state["window"] = (w.in_flight, w.acknowledged, w.last_acknowledged_entry_id, len(w.waiters), repr(w.error))
        for b, rc in self.requests.items():
            state[b] = (sorted(rc.pending), rc.pending_count, rc.out_bytes, rc.flush_scheduled)
        return state

    def run(self, seed: int, steps: int):
        rng = random.Random(seed)
        self.futures = []
        for _ in range(steps):
            r = rng.random()
            if r < 0.45:
                self.add(rng)
            elif r < 0.85:
                self.answer(rng)
            elif r < 0.93:
                self.loop.run_soon()
            elif r < 0.995:
                self.heal(rng)
            else:  # a refused add (closed handle, fenced writer): nothing changes
                self.core.refuse = True
                self.add(rng)
                self.core.refuse = None
        self.loop.run_soon()
        self.trace.append(("futures", [f.outcome for f in self.futures]))
        self.trace.append(("fields", self.fields()))
        return self.trace


QUORUMS = [(1, 1, 1), (3, 2, 2), (3, 3, 2), (5, 3, 2), (4, 2, 1)]


@needs_native
@pytest.mark.parametrize("seed", range(40))
def test_native_and_pure_cores_agree_on_the_same_script(seed):
    e, wq, aq = QUORUMS[seed % len(QUORUMS)]
    pure = Harness(PURE, e, wq, aq).run(seed, 400)
    native = Harness(NATIVE, e, wq, aq).run(seed, 400)
    assert native == pure


@pytest.mark.parametrize("mod", CORES)
@pytest.mark.parametrize("seed", range(10))
def test_completions_are_in_order_once_each_after_aq_acks(mod, seed):
    e, wq, aq = QUORUMS[seed % len(QUORUMS)]
    h = Harness(mod, e, wq, aq)
    trace = h.run(seed, 400)
    completed = [t[1] for t in trace if t[0] == "callback"]
    assert completed == sorted(completed) and len(set(completed)) == len(completed)
    fields = trace[-1][1]
    assert fields["lac"] <= fields["last_add_pushed"]
    assert all(op[2] < aq for op in fields["pending"][:1]) or fields["changing"]
    # every entry the core reported was sent: the frames written name entries 0..last_add_pushed
    written = {int(f.split(b":")[0]) for t in trace if t[0] == "write" for f in t[2]}
    assert written <= set(range(fields["last_add_pushed"] + 1))


@pytest.mark.parametrize("mod", CORES)
def test_frames_of_one_step_leave_in_one_write_and_a_large_batch_at_once(mod):
    h = Harness(mod, 1, 1, 1)
    for _ in range(3):
        h.core.async_add_entry(b"a", h.done)
    assert [t for t in h.trace if t[0] == "write"] == []
    h.loop.run_soon()
    writes = [t for t in h.trace if t[0] == "write"]
    assert writes == [("write", "b0", [b"0:-1:1:a", b"1:-1:2:a", b"2:-1:3:a"])]
    h.core.max_payload_bytes = 70_000
    h.core.async_add_entry(bytes(mod.EAGER_FLUSH_BYTES), h.done)  # over the eager bound: written at once
    assert len([t for t in h.trace if t[0] == "write"]) == 2
