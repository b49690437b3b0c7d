"""The chaos checker excuses only what a fault may really have taken (bk/testing/chaos/excuse.py).

Each test feeds the checker a crafted history that the checker before this change excused:
a journal-off crash after a checkpoint had made the entry durable, a bit flip excusing a whole
bookie, a ledger whose segment spans every live bookie skipping the replication check, and
excused entries that the run's JSON only counted.
"""
from __future__ import annotations

import asyncio
import os
import random
import types

import struct

import pytest
from bk.meta.ledger_metadata import LedgerMetadata, LedgerState
from bk.proto import DigestManager, StatusCode
from bk.testing.chaos import verify
from bk.testing.chaos.diagnose import Budget
from bk.testing.chaos.run import PASSWORD, Chaos, RunResult
from bk.testing.chaos.scenario import generate

BOOKIES = [f"127.0.0.1:{4000 + i}" for i in range(3)]


def _scenario(journal: bool):
    for seed in range(1, 500):
        s = generate(seed, mode="inprocess")
        if s.journal == journal:
            return s
    raise AssertionError("no seed draws that journal setting")


class _Storage:
    """A write cache and a checkpoint, as LedgerStorage's put/put_many/checkpoint are called."""

    def __init__(self):
        self.cache, self.durable, self.fail = {}, {}, False

    def put(self, lid, eid, entry):
        self.cache[(lid, eid)] = entry
        return True

    def put_many(self, lid, eids, entries):
        for e, b in zip(eids, entries):
            self.cache[(lid, e)] = b
        return len(entries)

    def checkpoint(self):
        if self.fail:  # the crash gate closed under it: its next write fails
            raise OSError(5, "crash gate")
        self.durable.update(self.cache)


class _Cluster:
    """Bookies whose restarts start a fresh storage (what InProcessChaosCluster does)."""

    def __init__(self, data_dir="/nonexistent"):
        self.servers, self.data_dir, self.count = {}, data_dir, len(BOOKIES)

    def bookie_id(self, i):
        return BOOKIES[i]

    def index_of(self, b):
        return BOOKIES.index(b)

    def alive(self, i):
        return i in self.servers

    async def restart(self, i):
        self.servers[i] = types.SimpleNamespace(bookie=types.SimpleNamespace(storage=_Storage()))

    def data_dir_of(self, i):
        return os.path.join(self.data_dir, f"bookie-{i}")

    def storage(self, i):
        return self.servers[i].bookie.storage


def _md(ensemble=BOOKIES, wq=2, aq=2, last=9):
    return LedgerMetadata(ensemble_size=len(ensemble), write_quorum_size=wq, ack_quorum_size=aq,
                          segments=((0, list(ensemble)),), state=LedgerState.CLOSED, last_entry_id=last,
                          password=PASSWORD)


def _chaos(journal: bool, cluster=None) -> Chaos:
    cluster = cluster or _Cluster()
    chaos = Chaos(_scenario(journal), cluster, [])
    for i in range(len(BOOKIES)):
        asyncio.run(chaos.restart(i))
    return chaos


def test_a_journal_off_crash_after_the_checkpoint_that_made_the_entry_durable_excuses_nothing():
    """Journal off, entry 0 of ledger 7 (write set bookies 0 and 1, AQ 2) was stored by both,
    a checkpoint of bookie 0 completed, then both crashed. Bookie 0 kept it: the loss must not
    be excused (before: any crash after the add was sent excused it on every bookie)."""
    chaos, md = _chaos(journal=False), _md()
    chaos.sent_at[(7, 0)] = __import__("time").monotonic()
    for i in (0, 1):
        chaos.cluster.storage(i).put(7, 0, b"entry")
    chaos.cluster.storage(0).checkpoint()
    chaos.mark_crashed(0)
    chaos.mark_crashed(1)
    assert verify.write_set(md, 0) == BOOKIES[:2]
    assert not verify.may_be_lost(chaos, md, 7, 0)
    assert chaos.excuses(7, 0) == {1: "journal-off-crash"}


def test_a_checkpoint_the_crash_interrupted_or_one_begun_before_the_store_keeps_the_excuse():
    chaos, md = _chaos(journal=False), _md()
    chaos.sent_at[(7, 0)] = __import__("time").monotonic()
    chaos.cluster.storage(0).checkpoint()  # began before the store: it did not carry the entry
    for i in (0, 1):
        chaos.cluster.storage(i).put(7, 0, b"entry")
    chaos.cluster.storage(1).fail = True
    try:
        chaos.cluster.storage(1).checkpoint()
    except OSError:
        pass
    chaos.mark_crashed(0)
    chaos.mark_crashed(1)
    assert verify.may_be_lost(chaos, md, 7, 0)
    assert chaos.excuses(7, 0) == {0: "journal-off-crash", 1: "journal-off-crash"}


LOG_HEADER_BYTES = 1024  # docs/STORAGE.md: magic, version, log id, map offset and count, padded


def _entry_log(path: str, ledger: int, entries: int, size: int = 40) -> list[tuple[int, int]]:
    """An entry log of `entries` records of `ledger`; returns each record's (offset, end)."""
    out, pos = [], LOG_HEADER_BYTES
    with open(path, "wb") as fh:
        fh.write(struct.pack(">4sIQQI", b"BKLO", 1, 1, 0, 0).ljust(LOG_HEADER_BYTES, b"\0"))
        for e in range(entries):
            body = ledger.to_bytes(8, "big") + e.to_bytes(8, "big") + bytes(size - 16)
            fh.write(struct.pack(">I", len(body)) + body)
            out.append((pos, pos + 4 + len(body)))
            pos += 4 + len(body)
    return out


def test_a_bit_flip_excuses_only_the_flipped_entry_on_that_bookie(tmp_path):
    """A bit flipped in bookie 0's entry log (AQ 1): only the entry whose record holds it may be
    lost; before, the flip marked the whole bookie lossy and excused every entry of its share."""
    from bk.testing.chaos.nemesis import KINDS
    cluster = _Cluster(str(tmp_path))
    logs = os.path.join(cluster.data_dir_of(0), "ledgers", "current")
    os.makedirs(logs)
    path = os.path.join(logs, "1.log")
    fault = types.SimpleNamespace(bookie=0, index=0, param=lambda k, d=None: {"target": "entrylog"}.get(k, d))
    for seed in range(100):  # the first flip that lands in a record, not in the log's header
        chaos = _chaos(journal=True, cluster=_Cluster(str(tmp_path)))
        records = _entry_log(path, ledger=7, entries=10)
        before = open(path, "rb").read()
        chaos.fault_rng = lambda f: random.Random(seed)
        asyncio.run(KINDS["bitflip"].apply(chaos, fault))
        after = open(path, "rb").read()
        offset = next(k for k in range(len(after)) if after[k] != before[k])
        if offset >= LOG_HEADER_BYTES:
            break
    flipped = [e for e, (lo, hi) in enumerate(records) if lo <= offset < hi]
    assert len(flipped) == 1
    md = _md(wq=2, aq=1)
    shares = [e for e in range(10) if BOOKIES[0] in verify.write_set(md, e)]
    assert flipped[0] in shares and len(shares) > 1
    for e in shares:
        assert verify.may_be_lost(chaos, md, 7, e) == (e == flipped[0]), e
    assert chaos.excuses(7, flipped[0]) == {0: "bitflip"}


class _Client:
    def __init__(self, bookie, answers):
        self.bookie, self.answers = bookie, answers

    def send_read(self):
        pass

    async def call(self, _send, lid, entry_id):
        body = self.answers(self.bookie, entry_id)
        if body is None:
            return types.SimpleNamespace(rc=int(StatusCode.ENOENTRY), body=b"")
        return types.SimpleNamespace(rc=int(StatusCode.EOK), body=body)


def test_a_ledger_spanning_every_live_bookie_still_gets_the_replication_check(monkeypatch):
    """AutoRecovery on, ledger 7 (3/2/2) on all three live bookies (no re-replication target).
    Bookie 1 checkpointed entry 9 and now answers "no such entry" for it: a replica it made
    durable is gone, a failure. Before, such a ledger skipped the replication check."""
    from bk.meta.memory import InMemoryStore
    chaos, md = _chaos(journal=True), _md()
    storage = chaos.cluster.storage(1)
    for e in range(10):
        if BOOKIES[1] in verify.write_set(md, e):
            storage.put(7, e, b"x")
    storage.checkpoint()
    digest = DigestManager(7, "CRC32C", PASSWORD)

    def answers(bookie, entry_id):
        if bookie == BOOKIES[1] and entry_id == 9:
            return None
        return digest.frame_entry(entry_id, entry_id - 1, 1, b"x")

    async def main():
        store = InMemoryStore()
        bkc = types.SimpleNamespace(
            registration=types.SimpleNamespace(writable_bookies=lambda: _coro(list(BOOKIES))),
            get_ledger_metadata=lambda lid: _coro(md), store=store,
            pool=types.SimpleNamespace(get=lambda b: _Client(b, answers)))
        out: list[str] = []
        await verify._check_replication(chaos, bkc, [7], {}, out)
        return out

    monkeypatch.setattr(verify, "PROCESS_AUDIT_WAIT_S", 0.0)
    out = asyncio.run(main())
    assert len(out) == 1 and out[0].startswith("replication: ledger 7") and BOOKIES[1] in out[0], out


def test_a_stuck_ledger_may_lack_what_the_bookie_never_surely_kept(monkeypatch):
    """The same ledger, but bookie 1 never stored entry 9 (AQ < WQ: the add went without it):
    nowhere to re-replicate it to, and nothing was lost: noted, not failed."""
    from bk.meta.memory import InMemoryStore
    chaos, md = _chaos(journal=True), _md(aq=1)
    digest = DigestManager(7, "CRC32C", PASSWORD)

    def answers(bookie, entry_id):
        return None if (bookie, entry_id) == (BOOKIES[1], 9) else digest.frame_entry(entry_id, entry_id - 1, 1, b"x")

    async def main():
        bkc = types.SimpleNamespace(
            registration=types.SimpleNamespace(writable_bookies=lambda: _coro(list(BOOKIES))),
            get_ledger_metadata=lambda lid: _coro(md), store=InMemoryStore(),
            pool=types.SimpleNamespace(get=lambda b: _Client(b, answers)))
        out: list[str] = []
        await verify._check_replication(chaos, bkc, [7], {}, out)
        return out

    monkeypatch.setattr(verify, "PROCESS_AUDIT_WAIT_S", 0.0)
    assert asyncio.run(main()) == []
    assert any("allowed" in line for line in chaos.trace)


async def _coro(value):
    return value


def test_every_excused_entry_is_listed_by_reason_in_the_runs_json():
    from bk.testing.chaos.runner import markdown, summarize
    r = RunResult(1, "inprocess", ok=True)
    r.excused = [{"ledger": 7, "entry": 3, "reason": "journal-off-crash", "bookies": {BOOKIES[0]: "journal-off-crash"}},
                 {"ledger": 7, "entry": 4, "reason": "bitflip", "bookies": {BOOKIES[1]: "bitflip"}}]
    r.lost_excused = 2
    j = r.to_json()
    assert j["excused_by_reason"] == {"bitflip": 1, "journal-off-crash": 1}
    assert [(x["ledger"], x["entry"], x["reason"]) for x in j["excused"]] == [(7, 3, "journal-off-crash"),
                                                                              (7, 4, "bitflip")]
    summary = summarize([j], 1.0, 1)
    assert summary["excused_by_reason"] == {"bitflip": 1, "journal-off-crash": 1}
    assert summary["excused"] == [[1, 7, 3, "journal-off-crash"], [1, 7, 4, "bitflip"]]
    table = markdown({**summary, "results": [j]})  # --report: docs/CHAOS.md's tables
    assert "| bitflip | 1 |" in table and "| journal-off-crash | 1 |" in table


def test_a_read_that_times_out_once_is_asked_again_before_the_entry_is_called_unreadable(monkeypatch):
    """Seed 40019 under a load of 20 on 2 cores: the verifier's read of an entry no fault could
    have taken timed out once (0.5 s client timeouts) and the run failed as "unreadable" and
    inv1. A timeout proves nothing: the entry is asked again; only a read that keeps failing is
    a finding. (The check itself stays: test_an_entry_that_stays_unreadable_is_a_finding.)"""
    chaos, md = _chaos(journal=True), _md(last=1)
    monkeypatch.setattr(verify.asyncio, "sleep", _no_sleep)
    out = asyncio.run(_read_with(monkeypatch, chaos, md, fail_first={(1, 1)}))
    assert out == ([], {0: b"e0", 1: b"e1"})


def test_an_entry_that_stays_unreadable_is_a_finding(monkeypatch):
    chaos, md = _chaos(journal=True), _md(last=1)
    monkeypatch.setattr(verify.asyncio, "sleep", _no_sleep)
    findings, got = asyncio.run(_read_with(monkeypatch, chaos, md, fail_first={(1, k) for k in range(1, 10)}))
    assert got == {0: b"e0"} and len(findings) == 1 and findings[0].startswith("unreadable: ledger 7 entry 1")


async def _no_sleep(_s):
    return None


async def _read_with(monkeypatch, chaos, md, fail_first):
    """verify._read_all against a fake client: read k of entry e fails when (e, k) is in fail_first."""
    from bk.errors import BKError, BookieTimeoutError
    calls: dict[int, int] = {}

    class _Handle:
        async def read_entries(self, first, last):
            if first != last:
                raise BKError("range read failed")
            calls[first] = calls.get(first, 0) + 1
            if (first, calls[first]) in fail_first:
                raise BookieTimeoutError(f"entry {first}: did not answer in time")
            return [types.SimpleNamespace(entry_id=first, data=b"e%d" % first)]

    class _BK:
        def __init__(self, *a, **k):
            pass

        async def __aenter__(self):
            return self

        async def __aexit__(self, *exc):
            return False

        async def open_ledger(self, *a, **k):
            return _Handle()

    monkeypatch.setattr(verify, "BookKeeper", _BK)
    chaos.cluster.metadata_uri = "memory://x"
    out: list[str] = []
    got = await verify._read_all(chaos, 7, md, out)
    return out, got


def _open_md(ensemble=BOOKIES, wq=2, aq=2):
    return LedgerMetadata(ensemble_size=len(ensemble), write_quorum_size=wq, ack_quorum_size=aq,
                          segments=((0, list(ensemble)),), state=LedgerState.OPEN, last_entry_id=-1,
                          password=PASSWORD)


def _chaos_two_ledgers(journal: bool) -> Chaos:
    """A Chaos whose scenario has at least two ledger plans (ledgers 7 and 8 here)."""
    for seed in range(1, 2000):
        s = generate(seed, mode="inprocess")
        if s.journal == journal and len(s.ledgers) >= 2:
            chaos = Chaos(s, _Cluster(), [])
            for i in range(len(BOOKIES)):
                asyncio.run(chaos.restart(i))
            chaos.ledgers = {s.ledgers[0].index: 7, s.ledgers[1].index: 8}
            return chaos
    raise AssertionError("no seed draws two ledgers with that journal setting")


def _acknowledge(chaos, lid: int, entries: int) -> None:
    import time
    for e in range(entries):
        chaos.history.ok(chaos.history.invoke(lid, b"e%d" % e), e)
        chaos.sent_at[(lid, e)] = time.monotonic()


def _verdict_when_recovery_never_closes(monkeypatch, chaos) -> list[str]:
    """verify.verify's findings when no recovery of ledgers 7 and 8 closes them (both stay OPEN)."""
    from bk.errors import BKError

    class _BK:
        def __init__(self, *a, **k):
            self.registration = types.SimpleNamespace(writable_bookies=lambda: _coro(list(BOOKIES)))

        async def __aenter__(self):
            return self

        async def __aexit__(self, *exc):
            return False

        async def get_ledger_metadata(self, lid):
            return _open_md()

    async def never_closes(chaos, bkc, lid):
        return None, BKError(f"recovery of ledger {lid} failed"), Budget(None, verify.RECOVERY_WAIT_S)

    async def nothing(*a):
        return None

    monkeypatch.setattr(verify, "BookKeeper", _BK)
    monkeypatch.setattr(verify, "_recover", never_closes)
    monkeypatch.setattr(verify, "_check_restarted_answers", nothing)
    chaos.cluster.metadata_uri = "memory://x"
    result = RunResult(chaos.s.seed, "inprocess", ok=False)
    asyncio.run(verify.verify(chaos, result))
    return result.failures


def test_a_flip_in_one_ledger_does_not_excuse_another_ledger_staying_open(monkeypatch):
    """Journal on, ledgers 7 and 8 (3/2/2 on the same three bookies) both left open by recovery.
    A bit flipped in entry 0 of ledger 7 on bookies 0 and 1 (its whole write set) may stall
    ledger 7's recovery; ledger 8 lost nothing, so its staying open is a liveness failure.
    Before, any flip made the bookie lossy for every ledger: ledger 8 was excused too."""
    chaos = _chaos_two_ledgers(journal=True)
    for lid in (7, 8):
        _acknowledge(chaos, lid, 10)
    chaos.mark_flipped(0, (7, 0))
    chaos.mark_flipped(1, (7, 0))
    failures = _verdict_when_recovery_never_closes(monkeypatch, chaos)
    assert [f.split(":", 1)[0] for f in failures] == ["liveness"], failures
    assert failures[0].startswith("liveness: ledger 8 "), failures
    assert any("ledger 7 stays OPEN" in line for line in chaos.trace), chaos.trace


def test_a_journal_off_crash_excuses_an_open_ledger_only_where_a_checkpoint_had_not_covered_it(monkeypatch):
    """Journal off, bookies 0 and 1 crashed. Ledger 7's 10 entries had been made durable by a
    checkpoint of both before the crash; the entry that ends its recovery (10) has bookies 1
    and 2 as its write set, and bookie 2 never crashed: its "no such entry" ends the scan
    (WQ - AQ + 1 = 1 negative). Nothing may have stalled it: ledger 7 open is a liveness
    failure. Ledger 8's entries were never checkpointed: entry 0 (bookies 0 and 1) may be lost
    on both, recovery rightly refuses to guess. Before, any journal-off crash made the bookie
    lossy for every entry of every ledger: both were excused."""
    chaos = _chaos_two_ledgers(journal=False)
    for lid in (7, 8):
        _acknowledge(chaos, lid, 10)
    for i in (0, 1):
        storage = chaos.cluster.storage(i)
        for e in range(10):
            storage.put(7, e, b"e%d" % e)
        storage.checkpoint()
        for e in range(10):
            storage.put(8, e, b"e%d" % e)
        chaos.mark_crashed(i)
    failures = _verdict_when_recovery_never_closes(monkeypatch, chaos)
    assert [f.split(":", 1)[0] for f in failures] == ["liveness"], failures
    assert failures[0].startswith("liveness: ledger 7 "), failures
    md = _open_md()
    assert verify.write_set(md, 10) == BOOKIES[1:]
    assert verify.recovery_may_stall(chaos, md, 7) is None
    assert verify.recovery_may_stall(chaos, md, 8).startswith("entry 0: 2 bookies")


def test_the_entry_before_the_last_segment_which_recovery_reads_for_the_length_may_excuse_it():
    """Seed 111343: journal off, a 2/2/2 ledger's entries 0-8 acknowledged by bookies 0 and 1,
    which then lost power together before any checkpoint; the writer moved entries 9- to a new
    segment and crashed before any was acknowledged. Recovery finds nothing in the last segment
    and reads entry 8, the last one before it, for the ledger's length: lost on both bookies of
    its write set, so recovery rightly refuses to close. The checker looked only from the last
    segment's first entry on, and called the ledger left open a liveness failure."""
    chaos = _chaos(journal=False)
    _acknowledge(chaos, 7, 9)
    for i in (0, 1):
        storage = chaos.cluster.storage(i)
        for e in range(9):
            storage.put(7, e, b"e%d" % e)
        chaos.mark_crashed(i)
    md = LedgerMetadata(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2,
                        segments=((0, BOOKIES[:2]), (9, [BOOKIES[2], BOOKIES[0]])), state=LedgerState.OPEN,
                        last_entry_id=-1, password=PASSWORD)
    assert verify.recovery_may_stall(chaos, md, 7).startswith("entry 8: 2 bookies")
    checkpointed = _chaos(journal=False)  # the same, but a checkpoint of bookie 0 covered entry 8
    _acknowledge(checkpointed, 7, 9)
    for i in (0, 1):
        storage = checkpointed.cluster.storage(i)
        for e in range(9):
            storage.put(7, e, b"e%d" % e)
        if i == 0:
            storage.checkpoint()
        checkpointed.mark_crashed(i)
    assert verify.recovery_may_stall(checkpointed, md, 7) is None
    chaos.history.ok(chaos.history.invoke(7, b"e9"), 9)  # the last segment's first acknowledged: found
    assert verify.recovery_may_stall(chaos, md, 7) is None


def test_bookies_that_cannot_answer_the_fence_excuse_an_open_ledger():
    """Two of the three bookies refused to come back (AQ 2): fencing cannot reach E - AQ + 1 = 2
    proofs, every ledger on them may stay open."""
    chaos = _chaos(journal=True)
    chaos.refused = {0: "journal corrupted", 1: "journal corrupted"}
    assert "may not answer the fence" in verify.recovery_may_stall(chaos, _open_md(), 7)
    chaos.refused = {0: "journal corrupted"}
    assert verify.recovery_may_stall(chaos, _open_md(), 7) is None  # no entry acknowledged, one bookie


# ------------------------------------------------- bookie processes watch themselves into files

def test_a_watch_file_says_what_the_in_memory_watch_says(tmp_path):
    """A bookie process's watch (excuse.watch_from_env) is a file of first stores and completed
    checkpoints; read back, it answers `durable` as the watch in memory does, a failed
    checkpoint is not in it, and a torn last line is skipped."""
    from bk.testing.chaos.excuse import read_watch, watch_storage
    path = tmp_path / "127.0.0.1_4000.1.watch"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    storage = _Storage()
    w = watch_storage(storage, log_fd=fd)
    storage.put(7, 0, b"a")
    storage.put_many(7, [1, 2], [b"b", b"c"])
    storage.checkpoint()
    storage.put(7, 3, b"d")
    storage.put(7, 0, b"a again")  # a second store of an entry keeps its first time
    storage.fail = True
    with pytest.raises(OSError):
        storage.checkpoint()  # interrupted: never counted
    os.write(fd, b"C 12")  # a torn line (the process killed mid-write)
    os.close(fd)
    back = read_watch(str(path))
    assert back.checkpoints == w.checkpoints == 1
    assert back.stored_at == w.stored_at
    for e in range(4):
        assert back.durable(7, e) == w.durable(7, e) == (e < 3)


def test_journal_off_crashes_of_bookie_processes_are_judged_from_their_watch_files(tmp_path):
    """Before, a bookie process's checkpoints were unseen and any journal-off crash after the
    add was sent excused the entry there (journal-off-crash-unwatched). Now the runner reads the
    files each storage instance of the process wrote: a checkpoint that covered the entry means
    no excuse; one that did not, the watched reason."""
    from bk.testing.chaos.excuse import watch_files, watch_storage

    class _ProcessCluster(_Cluster):
        def watch_files(self, i):
            return watch_files(str(tmp_path), BOOKIES[i])

    chaos = Chaos(_scenario(journal=False), _ProcessCluster(), [])
    chaos.sent_at[(7, 0)] = __import__("time").monotonic()
    storages = {}
    for i, instant in ((0, 5), (1, 6), (0, 10)):  # bookie 0 ran two storage instances
        fd = os.open(tmp_path / f"{BOOKIES[i].replace(':', '_')}.{instant}.watch", os.O_WRONLY | os.O_CREAT)
        storages[i] = _Storage()
        watch_storage(storages[i], log_fd=fd)
        storages[i].put(7, 0, b"entry")
        if (i, instant) == (1, 6):
            storages[i].checkpoint()
        os.close(fd)
    chaos.mark_crashed(0)
    chaos.mark_crashed(1)
    assert chaos.excuses(7, 0) == {0: "journal-off-crash-unwatched", 1: "journal-off-crash-unwatched"}
    chaos.read_process_watches()
    assert [len(w.stored_at) for w in chaos.watches[0]] == [1, 1]
    assert chaos.excuses(7, 0) == {0: "journal-off-crash"}
    assert chaos.durable_on(1, 7, 0) and not chaos.durable_on(0, 7, 0)


def _replication_verdict(monkeypatch, copied_after: int | None) -> tuple[list[str], int]:
    """Ledger 7 (3/2/1) on bookies 0-2 of four live ones (movable), entry 0 lost for real (its
    replicas are bookies 0 and 1), bookie 2 lacking the last entry of its share until the
    AutoRecovery worker has copied it: after `copied_after` probes (None: never)."""
    from bk.meta.memory import InMemoryStore
    chaos, md = _chaos(journal=True), _md(aq=1)
    share = [e for e in range(10) if BOOKIES[2] in verify.write_set(md, e)]
    assert 0 not in share
    digest = DigestManager(7, "CRC32C", PASSWORD)
    probes = [0]

    def answers(bookie, entry_id):
        if (bookie, entry_id) == (BOOKIES[2], share[-1]):
            probes[0] += 1
            if copied_after is None or probes[0] <= copied_after:
                return None
        return digest.frame_entry(entry_id, entry_id - 1, 1, b"x")

    async def main():
        bkc = types.SimpleNamespace(
            registration=types.SimpleNamespace(writable_bookies=lambda: _coro(BOOKIES + ["127.0.0.1:4999"])),
            get_ledger_metadata=lambda lid: _coro(md), store=InMemoryStore(),
            pool=types.SimpleNamespace(get=lambda b: _Client(b, answers)))
        out: list[str] = []
        await verify._check_replication(chaos, bkc, [7], {7: {0}}, out)
        return out

    monkeypatch.setattr(verify, "PROCESS_AUDIT_WAIT_S", 0.0)
    monkeypatch.setattr(verify, "REPLICATION_WAIT_S", 1.0)
    return asyncio.run(main()), probes[0]


def test_a_ledger_that_lost_entries_for_real_gets_time_to_have_its_other_shares_copied(monkeypatch):
    """Seed 60435 (journal off, AQ 1): a ledger with entries lost for real keeps its marker, so the
    wait for markers skipped it and its other shares were judged at once, 1 s after the heal,
    before the worker had copied a hole of another segment: a false failure. Now they get the
    same deadline as the others; the copy arrives, nothing is found."""
    out, probes = _replication_verdict(monkeypatch, copied_after=2)
    assert out == [] and probes > 2


def test_a_share_never_copied_is_still_a_failure(monkeypatch):
    out, _ = _replication_verdict(monkeypatch, copied_after=None)
    assert len(out) == 1 and out[0].startswith("replication: ledger 7") and BOOKIES[2] in out[0], out


def test_the_fence_probe_leaves_out_the_bookies_the_old_writer_saw_fail(tmp_path):
    """Seed 133302 (process cluster; a writer partitioned from one bookie of a 3/3/1 ledger, then
    killed): 'fence: 1 bookies of the old writer's ensemble accepted a plain add'. Its ensemble
    change had replaced that bookie in the metadata, and the writer was killed before it applied
    the change to its own view; recovery fenced the metadata's last segment, which rightly left
    the replaced bookie out. A writer sends no add to a bookie it saw fail and counts none of its
    answers, so the probe that stands for the old writer leaves those bookies out too."""
    from bk.client import BookKeeper
    from bk.proto import master_key
    from bk.testing.chaos.clients import CrashableHandle
    from bk.testing.inprocess import InProcessCluster

    async def main():
        async with InProcessCluster(tmp_path, bookies=4) as cluster:
            ids = cluster.bookie_ids
            async with BookKeeper(cluster.metadata_uri) as other:
                writer = BookKeeper(cluster.metadata_uri)
                await writer.start()
                writer.placement.new_ensemble = lambda size, writable, exclude=(), **_: list(ids[:3])
                lh = await writer.create_ledger(3, 3, 1, password=PASSWORD)
                for i in range(5):
                    await lh.add_entry(b"entry %d" % i)
                # the writer saw ids[2] fail; its change to [0, 1, 3] reached the metadata, then it died
                lh._core.failed_bookies.add(ids[2])
                await other.ledger_manager.update_ledger_metadata(
                    lh.ledger_id, lambda md: md.with_ensemble_change(5, (ids[0], ids[1], ids[3])))
                CrashableHandle(lh, writer).crash()
                await other.open_ledger(lh.ledger_id, password=PASSWORD, recovery=True)
                md = await other.get_ledger_metadata(lh.ledger_id)
                assert md.is_closed and md.last_entry_id == 4
                chaos = types.SimpleNamespace(handles={0: lh}, crashed_writers={0},
                                              history=types.SimpleNamespace(events=lambda lid: []))
                plan = types.SimpleNamespace(index=0, writer_end="dies")
                out: list[str] = []
                await verify._check_fence(chaos, plan, lh.ledger_id, md, out)
                assert out == []
                # the bookie itself accepts the add: it was never fenced (so the probe did decide)
                assert await verify._raw_add(ids[2], lh.ledger_id, 5, master_key(PASSWORD)) == 0
    asyncio.run(main())


def test_a_restarted_bookies_negative_is_noted_with_its_limbo_and_repair(tmp_path):
    """Seed 133214's failure (a restarted journal-off bookie answered ENOENTRY for an acknowledged
    entry) did not replay, and its trace said nothing of that bookie's state: the trace now notes
    the ledger's segments and, in-process, the bookie's limbo, fence, what it stores and its repair."""
    from bk.client import BookKeeper
    from bk.testing.chaos.clusters import InProcessChaosCluster

    async def main():
        cluster = await InProcessChaosCluster(str(tmp_path / "c"), 2).start()
        try:
            async with BookKeeper(cluster.metadata_uri) as bkc:
                lh = await bkc.create_ledger(2, 2, 2, password=PASSWORD)
                for i in range(3):
                    await lh.add_entry(b"entry %d" % i)
                await lh.close()
                md = await bkc.get_ledger_metadata(lh.ledger_id)
            notes: list[str] = []
            chaos = types.SimpleNamespace(cluster=cluster, note=notes.append)
            await verify._note_negative(chaos, 1, lh.ledger_id, 7, md)
            assert len(notes) == 2, notes
            assert notes[0].endswith("segments 0: [0, 1]") or "segments 0: [1, 0]" in notes[0], notes
            assert "in limbo False, fenced False, highest entry stored 2, entry 7 missing True" in notes[1], notes
            assert "phase one None; repair None" in notes[1], notes
        finally:
            await cluster.stop()
    asyncio.run(main())


class _RacingMetadata:
    """The checker's client, with one metadata read that loses a race: the read returns what
    the store held, and before the checker gets it `meanwhile()` runs (a replication swap)."""

    def __init__(self, bkc, meanwhile):
        self.pool, self.ledger_manager, self._real, self._meanwhile = bkc.pool, self, bkc, meanwhile

    async def read_ledger_metadata(self, ledger_id: int):
        got = await self._real.ledger_manager.read_ledger_metadata(ledger_id)
        if self._meanwhile is not None:
            meanwhile, self._meanwhile = self._meanwhile, None
            await meanwhile(got[0])
        return got

    async def get_ledger_metadata(self, ledger_id: int):
        return (await self.read_ledger_metadata(ledger_id))[0]


async def _restarted_without_its_entries(tmp_path, monkeypatch):
    """A 3-bookie journal-off cluster, a closed 2/2/2 ledger of 5 entries on [A, B], B killed
    (it loses them: no checkpoint ran) and restarted with its repair held (BP-46 phase one has
    put the ledger in limbo). Returns (cluster, bkc, ledger id, A, B, C, the held repair's gate)."""
    from bk.client import BookKeeper
    from bk.replication.integrity import DataIntegrityCheck
    from bk.testing.chaos.clusters import InProcessChaosCluster
    gate, repair = asyncio.Event(), DataIntegrityCheck._repair

    async def held(self, ledger_id):
        await gate.wait()
        return await repair(self, ledger_id)
    monkeypatch.setattr(DataIntegrityCheck, "_repair", held)
    cluster = await InProcessChaosCluster(str(tmp_path / "c"), 3, journal_write_data=False,
                                          flush_interval_ms=600_000, data_integrity_repair_retry_max_s=0.2).start()
    bkc = await BookKeeper(cluster.metadata_uri).start()
    lh = await bkc.create_ledger(2, 2, 2, password=PASSWORD)
    for i in range(5):
        await lh.add_entry(b"entry %d" % i)
    await lh.close()
    a, b = (cluster.index_of(x) for x in lh.metadata.segments[0][1])
    c = ({0, 1, 2} - {a, b}).pop()
    await cluster.crash(b)
    await cluster.restart(b)
    bookie = cluster.servers[b].bookie
    assert bookie.is_limbo(lh.ledger_id)
    assert await asyncio.to_thread(bookie.missing_entries, lh.ledger_id, range(5)) == list(range(5))
    return cluster, bkc, lh.ledger_id, a, b, c, gate


def _restarted_chaos(cluster, b: int, lid: int, notes: list):
    history = types.SimpleNamespace(acknowledged=lambda ledger: {e: b"entry %d" % e for e in range(5)})
    return types.SimpleNamespace(cluster=cluster, crashed={b}, refused={}, ledgers={0: lid}, history=history,
                                 note=notes.append, rejudged={})


async def _limbo_cleared(bookie, lid: int) -> None:
    for _ in range(200):
        if not bookie.is_limbo(lid):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the held repair did not clear limbo")


def test_seed133214_a_share_moved_away_while_the_checker_asked_is_not_a_false_negative(tmp_path, monkeypatch):
    """Seed 133214 (in-process, journal off, AutoRecovery on): the restarted-bookie check read a
    ledger's metadata once, then asked bookie 2 for each acknowledged entry of its share. Meanwhile
    a replication worker (the auditor had marked bookie 2 while it was down) moved bookie 2's share
    of the segment starting at entry 9 to another bookie, and bookie 2's repair, reading the new
    metadata, had nothing of that segment to copy and cleared limbo: its ENOENTRY was right (the
    entry is no longer its share), the checker judged it by metadata that no longer held. Here the
    swap lands between the checker's metadata read and its entry reads, as then. The check now
    judges a negative by the metadata read after it: a failure only if it did not change."""
    from bk.replication.replicator import LedgerReplicator

    async def main():
        cluster, bkc, lid, a, b, c, gate = await _restarted_without_its_entries(tmp_path, monkeypatch)
        try:
            async def swap(md):
                await LedgerReplicator(bkc).replicate_segment(lid, md, 0, cluster.bookie_id(b), cluster.bookie_id(c))
                gate.set()
                await _limbo_cleared(cluster.servers[b].bookie, lid)
            notes: list[str] = []
            out: list[str] = []
            chaos = _restarted_chaos(cluster, b, lid, notes)
            await verify._check_restarted_answers(chaos, _RacingMetadata(bkc, swap), out)
            md = await bkc.get_ledger_metadata(lid)
            assert cluster.bookie_id(b) not in md.segments[0][1] and cluster.bookie_id(c) in md.segments[0][1]
            assert out == [], (out, notes)
            # entry 0 was asked under the old metadata, answered ENOENTRY, and judged again: not its share
            assert chaos.rejudged == {"restarted_negative_metadata_changed": 1}, notes
            assert f"restarted bookie {b} answered ENOENTRY for entry 0 of ledger {lid} while its metadata" \
                   f" changed (segments now 0: {[a, c]})" in notes[0], notes
        finally:
            await bkc.close()
            await cluster.stop()
    asyncio.run(main())


def test_a_negative_while_the_metadata_still_names_the_bookie_stays_a_failure(tmp_path, monkeypatch):
    """The other side of seed 133214's fix: a restarted journal-off bookie that cleared limbo
    without the entries of its share (here cleared by hand: a repair that skipped them) and
    answers ENOENTRY is still a failure, with its notes."""
    async def main():
        cluster, bkc, lid, a, b, c, gate = await _restarted_without_its_entries(tmp_path, monkeypatch)
        try:
            await cluster.servers[b].bookie.clear_limbo([lid])
            notes: list[str] = []
            out: list[str] = []
            await verify._check_restarted_answers(_restarted_chaos(cluster, b, lid, notes), _RacingMetadata(bkc, None),
                                                  out)
            assert out == [f"no-such-entry: restarted journal-off bookie {b} answered ENOENTRY for acknowledged"
                           f" entry 0 of ledger {lid}"], out
            assert "in limbo False" in notes[1], notes
            gate.set()
        finally:
            await bkc.close()
            await cluster.stop()
    asyncio.run(main())


def test_seed190140_an_add_acknowledged_while_the_crash_waited_is_excused_by_it(tmp_path):
    """Seed 190140 (process, journal off, a 2/2/2 ledger): the crash was dated when the nemesis
    asked for it, but the kill came later (it waits for the bookie's lock and, for a process, a
    thread, on a loaded host). An add sent in between was acknowledged by that bookie from its
    write cache and lost with it, and the checker, taking the crash for one before the add,
    called the entry unreadable though both bookies of its write set may have lost it. Here the
    crash waits on the bookie's lock (held by the test) while entry 1 is added: the crash is now
    dated when the bookie stops, and entry 1 is excused on it."""
    from bk.client import BookKeeper
    from bk.testing.chaos.clusters import InProcessChaosCluster
    from bk.testing.chaos.nemesis import KINDS

    async def main():
        cluster = await InProcessChaosCluster(str(tmp_path / "c"), 2, journal_write_data=False,
                                              flush_interval_ms=600_000).start()
        try:
            chaos = Chaos(_scenario(journal=False), cluster, [])
            for i in range(2):
                chaos.watch(i)
            async with BookKeeper(cluster.metadata_uri) as bkc:
                lh = await bkc.create_ledger(2, 2, 2, password=PASSWORD)
                await lh.add_entry(b"entry 0")
                fault = types.SimpleNamespace(bookie=0, index=0, param=lambda k, d=None: d)
                async with cluster._locks[0]:  # the kill has to wait for the bookie's lock
                    crash = asyncio.ensure_future(KINDS["crash"].apply(chaos, fault))
                    for _ in range(5):
                        await asyncio.sleep(0)
                    assert not crash.done() and cluster.alive(0)
                    chaos.sent_at[(lh.ledger_id, 1)] = __import__("time").monotonic()
                    await lh.add_entry(b"entry 1")  # acknowledged by both bookies: AQ 2
                assert (await crash).startswith("kill -9 bookie 0 (")
                await cluster.restart(0)
                gone = await asyncio.to_thread(cluster.servers[0].bookie.missing_entries, lh.ledger_id, range(2))
                assert gone == [0, 1]  # the crash took both (journal off, no checkpoint ran)
            md = _md(ensemble=[cluster.bookie_id(0), cluster.bookie_id(1)], last=1)
            # bookie 0 lost it (write cache, no checkpoint): its crash came after the add was sent
            assert chaos.excuses(lh.ledger_id, 1) == {0: "journal-off-crash"}
            assert verify.lossy_in_write_set(chaos, md, lh.ledger_id, 1) == [cluster.bookie_id(0)]
        finally:
            await cluster.stop()
    asyncio.run(main())
