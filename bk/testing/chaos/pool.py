"""Supervised worker processes for many chaos runs.

Why not multiprocessing.Pool: a run that hangs in a way asyncio cannot cancel (a
thread join, a blocking call) would hold its worker forever, and a worker that
dies loses its task and leaves Pool waiting for it. Here the parent hands each
worker one seed at a time and watches the clock: a worker still on one seed
`hang_s` after it started gets SIGUSR1 (faulthandler writes every thread's stack
to a file), then SIGKILL; the seed is recorded as a `hang` failure with those
stacks, and a fresh worker takes its place. A worker that dies is recorded as a
`harness` failure of its seed. Workers are forked (the parent has no event loop
or threads yet) and replaced after `tasks_per_worker` runs, so whatever one run
leaks does not pile up. Each live worker holds one of `jobs` port slots
(bk.testing.ports.narrow): the servers two workers start never pick the same port.
"""
from __future__ import annotations

import faulthandler
import logging
import multiprocessing
import os
import queue
import signal
import tempfile
import time
from typing import Callable, Iterable, Iterator

TASKS_PER_WORKER = 200
DRAIN_S = 10.0  # how long the last messages of a worker that exited normally may take to be read


def _worker_main(wid: int, port_slot: tuple[int, int], tasks, results, options: dict, run_one, limit: int,
                 dump_path: str, on_exit) -> None:
    from bk.testing import ports
    ports.narrow(*port_slot)
    dump = open(dump_path, "w")
    faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)
    logging.disable(logging.CRITICAL if not options.get("verbose") else logging.NOTSET)
    for _ in range(limit):
        seed = tasks.get()
        if seed is None:
            break
        results.put(("start", wid, seed, None))
        results.put(("done", wid, seed, run_one(seed, options).to_json()))
    if on_exit is not None:
        on_exit()  # a forked worker leaves by os._exit: atexit handlers would not run
    results.put(("exit", wid, None, None))


class _Slot:
    def __init__(self, ctx, wid: int, port_slot: tuple[int, int], results, options: dict, run_one, limit: int,
                 dump_dir: str, on_exit):
        self.wid = wid
        self.port_slot = port_slot
        self.tasks = ctx.Queue()
        self.dump_path = os.path.join(dump_dir, f"worker-{wid}.stacks")
        self.proc = ctx.Process(target=_worker_main, args=(wid, port_slot, self.tasks, results, options, run_one,
                                                           limit, self.dump_path, on_exit), daemon=True)
        self.proc.start()
        self.seed: int | None = None  # the seed handed over and not finished
        self.started = 0.0
        self.given = 0
        self.limit = limit
        self._exited_at: float | None = None

    def exited_at(self, now: float) -> float:
        """When the supervisor first saw this worker's process gone."""
        if self._exited_at is None:
            self._exited_at = now
        return self._exited_at

    def give(self, seed: int | None) -> None:
        self.seed, self.started = seed, time.monotonic()
        self.given += seed is not None
        self.tasks.put(seed)


def _failed(seed: int, options: dict, mode_of: Callable[[int], str], replay_of: Callable[[int], str],
            why: str, trace: list[str]) -> dict:
    return {"seed": seed, "mode": mode_of(seed), "ok": False, "failures": [why], "categories": [why.split(":")[0]],
            "faults": [], "faults_applied": 0, "acked": 0, "lost_excused": 0, "duration_s": 0.0,
            "replay": replay_of(seed), "trace": trace}


def run_supervised(seeds: Iterable[int], options: dict, *, jobs: int, run_one, hang_s: float,
                   mode_of, replay_of, tasks_per_worker: int = TASKS_PER_WORKER, on_exit=None) -> Iterator[dict]:
    """Yield each seed's result dict (RunResult.to_json()) as workers finish them."""
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    pending = list(seeds)[::-1]  # pop() from the end: seeds in order
    dump_dir = tempfile.mkdtemp(prefix="bk-chaos-stacks-")
    slots: dict[int, _Slot] = {}
    next_wid = [0]
    free_port_slots = list(range(jobs))  # a retired worker's slot goes to its replacement

    def spawn() -> None:
        wid = next_wid[0]
        next_wid[0] += 1
        port_slot = (free_port_slots.pop(0), jobs)
        slot = slots[wid] = _Slot(ctx, wid, port_slot, results, options, run_one, tasks_per_worker, dump_dir,
                                  on_exit)
        feed(slot)

    def feed(slot: _Slot) -> None:
        if pending and slot.given < slot.limit:
            slot.give(pending.pop())
        else:
            slot.give(None)

    def retire(slot: _Slot, kill: bool) -> None:
        if kill and slot.proc.is_alive():
            slot.proc.kill()
        slot.proc.join(5)
        if slots.pop(slot.wid, None) is not None:
            free_port_slots.append(slot.port_slot[0])
            free_port_slots.sort()
        if pending:
            spawn()

    try:
        for _ in range(min(jobs, len(pending))):
            spawn()
        while slots:
            try:
                kind, wid, seed, payload = results.get(timeout=1.0)
            except queue.Empty:
                kind = None
            if kind == "start" and wid in slots:
                slots[wid].started = time.monotonic()
            elif kind == "done" and wid in slots:
                slots[wid].seed = None
                yield payload
                feed(slots[wid])
            elif kind == "exit" and wid in slots:
                retire(slots[wid], kill=False)
            now = time.monotonic()
            for slot in list(slots.values()):
                if slot.seed is not None and now - slot.started > hang_s:
                    os.kill(slot.proc.pid, signal.SIGUSR1)
                    time.sleep(1.0)
                    stacks = _read(slot.dump_path)
                    seed = slot.seed
                    retire(slot, kill=True)
                    yield _failed(seed, options, mode_of, replay_of,
                                  f"hang: the run was still going {hang_s:g}s after it started (worker killed)",
                                  stacks.splitlines()[-200:])
                elif not slot.proc.is_alive() and slot.wid in slots:
                    if slot.seed is not None and slot.proc.exitcode == 0 and now - slot.exited_at(now) < DRAIN_S:
                        # A worker that left normally put its last "done" and "exit" before it
                        # exited: they may still be queued behind other workers' messages. Read
                        # on; only a seed still unanswered after DRAIN_S is the worker's failure
                        # (before, its finished seed was called a harness failure and its real
                        # result dropped: seed 81867 of a 10-job run).
                        continue
                    seed = slot.seed
                    retire(slot, kill=False)
                    if seed is not None:
                        yield _failed(seed, options, mode_of, replay_of,
                                      f"harness: worker died with exit code {slot.proc.exitcode}", [])
    finally:
        for slot in list(slots.values()):
            if slot.proc.is_alive():
                slot.proc.kill()
            slot.proc.join(5)


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


__all__ = ["TASKS_PER_WORKER", "run_supervised"]
