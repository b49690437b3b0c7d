"""One chaos run as data: everything it does is drawn from one integer seed.

`generate(seed)` returns a Scenario: the cluster (in-process or real `bk bookie`
processes, bookie count, journal on/off, AutoRecovery on/off), the workload
(ledgers with random E/WQ/AQ, entry counts and sizes, writers' in-flight
windows and how each writer ends, tailing readers) and the nemesis schedule
(a list of Fault: kind, bookie, start, duration, kind-specific parameters).

Reproducibility rules (what makes replays and shrinking work):
- each part has its own random stream derived from (seed, part name): the
  cluster and workload are the same whichever faults are kept, and fault k's
  parameters come from (seed, "fault", k) alone, so dropping fault j during
  shrinking leaves every other fault exactly as it was; a later group of kinds
  (disk faults) draws from its own streams and is appended, so adding it left
  every seed's earlier schedule as it was;
- a Scenario with `keep` set runs only the faults whose index is in `keep`
  (their indices stay the original ones, so replay commands stay short);
- the mode (in-process or processes) is drawn from (seed, "mode") against
  the process share, and a replay names the mode explicitly;
- a scenario drawn for a break (`draw_for`, by default the break it runs) may
  force what that break needs and append one fault from its own stream (see
  `_drawn_for`); the same scenario runs with a correct bookie (`draw_for`
  without `test_break`), which is how a self-test shows its seeds pass.
What a run does still depends on timing (thread and socket scheduling), so a
seed replays to the same fault schedule and workload, and usually, not
always, to the same interleaving: the runner replays a failure several times
before it shrinks (runner.py).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

INPROCESS, PROCESS = "inprocess", "process"
WRITER_ENDS = ("closes", "dies", "lives")  # closes its ledger / stops, handle kept / writes on through recovery


def stream(seed: int, *parts) -> random.Random:
    """The random stream of one part of a scenario (independent of every other part)."""
    return random.Random(":".join(str(p) for p in (seed, *parts)))


@dataclass(frozen=True)
class LedgerPlan:
    index: int
    ensemble: int
    write_quorum: int
    ack_quorum: int
    entries: int
    entry_bytes: tuple[int, int]  # payload sizes drawn in [lo, hi]
    window: int  # adds in flight
    pace_ms: float  # pause between two adds (so the writes span the fault schedule)
    writer_end: str  # WRITER_ENDS
    long: bool = False  # the seed's long ledger (thousands of entries; drawn from the "client" streams)

    @property
    def shape(self) -> str:
        return f"{self.ensemble}/{self.write_quorum}/{self.ack_quorum}"


@dataclass(frozen=True)
class Fault:
    """One nemesis action: `kind` (nemesis.KINDS) applied to bookie `bookie` at
    `at_ms` after the writers start, healed `duration_ms` later (or at the end)."""

    index: int
    kind: str
    bookie: int
    at_ms: int
    duration_ms: int
    params: tuple = ()  # kind-specific (key, value) pairs, drawn by the kind

    def param(self, key: str, default=None):
        return dict(self.params).get(key, default)

    def describe(self) -> str:
        extra = "".join(f" {k}={v}" for k, v in self.params)
        return f"#{self.index} {self.kind} bookie {self.bookie} at {self.at_ms}ms for {self.duration_ms}ms{extra}"


@dataclass(frozen=True)
class Scenario:
    seed: int
    mode: str
    bookies: int
    journal: bool  # False: BP-46, journal_write_data = false
    autorecovery: bool
    ledgers: tuple[LedgerPlan, ...]
    tailing_readers: int
    faults: tuple[Fault, ...]
    keep: frozenset | None = None  # None: every fault
    test_break: str = ""  # a deliberately broken bookie (bk.testing.breaks), for the runner's self-tests
    draw_for: str = ""  # the break this scenario was drawn to expose ("" = none; see _drawn_for)
    tls: bool = False  # bookies serve TLS and every client connects with it (the "client" streams)

    def protocol(self, role: str) -> str:
        """The wire protocol of one client of the run ("writer-0", "tailer-1", "recoverer-<fault>-a",
        "checker"...), from its own stream: v2 or v3 (BookKeeper's useV2WireProtocol), half each."""
        return "v3" if stream(self.seed, "client", "protocol", role).random() < 0.5 else "v2"

    def client_target(self, fault: "Fault") -> int:
        """The plan index of the writer (or ledger) a client fault acts on."""
        return fault.param("ledger", 0) % len(self.ledgers)

    @property
    def active_faults(self) -> tuple[Fault, ...]:
        return tuple(f for f in self.faults if self.keep is None or f.index in self.keep)

    def keeping(self, indices) -> "Scenario":
        return replace(self, keep=frozenset(indices))

    def describe(self) -> str:
        shapes = ", ".join(f"{p.shape} x{p.entries} w{p.window} {p.writer_end}" for p in self.ledgers)
        return (f"seed {self.seed}: {self.mode}, {self.bookies} bookies, journal {'on' if self.journal else 'off'},"
                f" autorecovery {'on' if self.autorecovery else 'off'},{' TLS,' if self.tls else ''} ledgers [{shapes}],"
                f" {self.tailing_readers} tailing readers, {len(self.active_faults)} of {len(self.faults)} faults")

    def replay_args(self) -> list[str]:
        """The command-line arguments that replay exactly this scenario."""
        args = ["--seed", str(self.seed), "--mode", self.mode]
        if self.keep is not None:
            args += ["--faults", ",".join(str(i) for i in sorted(self.keep)) or "none"]
        if self.test_break:
            args += ["--break", self.test_break]
        if self.draw_for != self.test_break:
            args += ["--draw-for", self.draw_for or "none"]
        return args


def _shape(rng: random.Random, bookies: int) -> tuple[int, int, int]:
    # Leave at least one spare bookie most of the time (ensemble changes need one).
    e = rng.choice([k for k in (2, 3, 3, 3, 4) if k <= max(2, bookies - (rng.random() < 0.8))])
    wq = rng.choice([k for k in range(2, e + 1)])
    aq = rng.choices(range(1, wq + 1), weights=[1] + [4] * (wq - 1))[0]
    return e, wq, aq


# Drawn for ack-before-fsync (bk.testing.breaks): its acknowledged-but-unsynced entries exist
# only between an ack and the next checkpoint (which fsyncs the entry logs and the index,
# making them durable after all), and a power cut shows them only if it hits every replica.
# The schedule's clock-timed cuts missed it in about half the seeds: under load the writers
# connect and create their ledgers after a cut at 0-500 ms, so it found nothing acknowledged
# (seed 148 at b1d4a31: one entry acknowledged in all, after the cuts). So a seed drawn for it
# runs the journal on and gets one more cut of the whole cluster anchored to the workload:
# right after its `after_acks`-th acknowledgement (Chaos.run_fault), not at a wall-clock time;
# the seed's other faults start their clocks only after that cut (else one of them could cut
# or stall the cluster before anything is acknowledged: seed 148's own cut at 52 ms did).
UNSYNCED_CUT_BREAKS = ("ack-before-fsync",)


def _drawn_for(seed: int, index: int, ledgers) -> Fault:
    rng = stream(seed, "draw-for", "unsynced-cut")
    total = sum(p.entries for p in ledgers)
    after_acks = rng.randint(1, max(1, min(40, total // 2)))
    return Fault(index, "power-loss-all", 0, 0, rng.randint(50, 400),
                 (("after_acks", after_acks), ("tear", rng.random() < 0.5)))


def generate(seed: int, *, mode: str | None = None, process_share: float = 0.02,
             kinds=None, test_break: str = "", max_faults: int = 5, draw_for: str | None = None) -> Scenario:
    """The scenario of `seed` (see the module docstring for what is independent of what).

    kinds: the nemesis table to draw from (default nemesis.KINDS), each with a
    `weight` and a `modes` set; max_faults bounds the schedule's length; draw_for:
    the break to draw for (None: `test_break`; "" none), with `test_break` "" the
    same scenario runs a correct bookie."""
    from .nemesis import KINDS
    kinds = KINDS if kinds is None else kinds
    if mode is None:
        mode = PROCESS if stream(seed, "mode").random() < process_share else INPROCESS
    rng = stream(seed, "cluster")
    bookies = rng.choice([3, 4, 4, 5]) if mode == INPROCESS else rng.choice([3, 4])
    draw_for = test_break if draw_for is None else draw_for
    journal = rng.random() < 0.7 or draw_for in UNSYNCED_CUT_BREAKS  # (drawn either way: streams stay)
    autorecovery = rng.random() < 0.3
    work = stream(seed, "workload")
    ledgers = []
    for i in range(work.choice([1, 1, 2, 3])):
        e, wq, aq = _shape(work, bookies)
        lo = work.choice([0, 1, 16, 100])
        entries = work.randint(5, 120)
        ledgers.append(LedgerPlan(i, e, wq, aq, entries=entries, entry_bytes=(lo, lo + work.choice(
            [0, 64, 512, 3000])), window=work.choice([1, 4, 16, 32]),
            pace_ms=round(work.uniform(100, 900) / entries, 2),
            writer_end=work.choices(WRITER_ENDS, weights=[3, 4, 3])[0]))
    readers = work.choice([0, 0, 1, 2])
    def usable(group: str) -> list:
        return [k for k in kinds.values() if k.group == group and mode in k.modes and k.weight > 0
                and (k.needs is None or k.needs(journal, autorecovery))]

    def draw(frng, index: int, choices: list) -> Fault:
        kind = frng.choices(choices, weights=[u.weight for u in choices])[0]
        at_ms = frng.randint(0, 500)
        duration_ms = frng.randint(*kind.duration_ms)
        params = tuple(sorted(kind.draw(frng).items())) if kind.draw else ()
        return Fault(index, kind.name, frng.randrange(bookies), at_ms, duration_ms, params)

    core = usable("core")
    count = stream(seed, "faults").choice([k for k in range(0, max_faults + 1)] + [2, 3, 3])
    faults = [draw(stream(seed, "fault", k), k, core) for k in range(count)]
    # later groups: their own streams, appended after the core faults (see NemesisKind.group)
    for group in sorted({k.group for k in kinds.values()} - {"core", "client"}):  # client: _client_draws
        choices = usable(group)
        if choices:
            extra = stream(seed, group, "count").choices([0, 1, 2], weights=[6, 3, 1])[0]
            base = len(faults)
            faults += [draw(stream(seed, group, j), base + j, choices) for j in range(extra)]
    if draw_for in UNSYNCED_CUT_BREAKS:
        faults.append(_drawn_for(seed, len(faults), ledgers))
    ledgers, faults, tls = _client_draws(seed, mode, bookies, ledgers, faults, kinds)
    return Scenario(seed, mode, bookies, journal, autorecovery, tuple(ledgers), readers, tuple(faults),
                    test_break=test_break, draw_for=draw_for, tls=tls)


# ------------------------------------------------------------ the client side (issue 28)
# Drawn last, each from its own "client" stream, so every earlier draw of a seed (cluster,
# workload, core/disk/draw-for faults and their indices) is exactly what it was before:
# - a long ledger (LONG_LEDGER_SHARE of the seeds): LONG_ENTRIES small entries as fast as a
#   larger window allows, appended as the last ledger, so ensembles change mid-ledger under the
#   faults, recovery reads a long tail and write caches fill;
# - TLS (TLS_SHARE): the bookies serve TLS and every client connects with it;
# - the wire protocol of each client (Scenario.protocol);
# - client faults (nemesis kinds of the "client" group: writer-crash, client-partition,
#   recover-race), 0-2 a run, appended after every other fault.
LONG_LEDGER_SHARE, LONG_ENTRIES, LONG_ENTRY_BYTES, LONG_WINDOWS = 0.17, (1000, 4000), (16, 256), (32, 64, 128)
TLS_SHARE = 0.15


def _client_draws(seed: int, mode: str, bookies: int, ledgers: list, faults: list, kinds) -> tuple:
    rng = stream(seed, "client", "long")
    if rng.random() < LONG_LEDGER_SHARE:
        e, wq, aq = _shape(rng, bookies)
        lo = rng.randint(*LONG_ENTRY_BYTES)
        ledgers = ledgers + [LedgerPlan(len(ledgers), e, wq, aq, entries=rng.randint(*LONG_ENTRIES),
                                        entry_bytes=(lo, rng.randint(lo, LONG_ENTRY_BYTES[1])),
                                        window=rng.choice(LONG_WINDOWS), pace_ms=0.0,
                                        writer_end=rng.choices(WRITER_ENDS, weights=[3, 4, 3])[0], long=True)]
    tls = stream(seed, "client", "tls").random() < TLS_SHARE
    choices = [k for k in kinds.values() if k.group == "client" and mode in k.modes and k.weight > 0]
    if choices:
        count = stream(seed, "client", "count").choices([0, 1, 2], weights=[6, 3, 1])[0]
        for j in range(count):
            frng = stream(seed, "client", "fault", j)
            kind = frng.choices(choices, weights=[u.weight for u in choices])[0]
            params = tuple(sorted(kind.draw(frng).items())) if kind.draw else ()
            faults = faults + [Fault(len(faults), kind.name, frng.randrange(bookies), frng.randint(0, 500),
                                     frng.randint(*kind.duration_ms), params)]
    return ledgers, faults, tls


__all__ = ["Fault", "INPROCESS", "LONG_LEDGER_SHARE", "LedgerPlan", "TLS_SHARE", "PROCESS", "Scenario", "WRITER_ENDS", "generate", "stream"]
