"""The bookie's CPU for a lone ADD: its one-add primitive against the same add as a run of one.

    python -m bench.lone_add                  # 50,000 adds per round, 8 rounds alternated
    python -m bench.lone_add --json lone.json

A lone ADD (one per socket read: a client with one add in flight, or a slow trickle)
reaches RequestProcessor._add, which hands it to `Bookie.add_entry_cb`, the bookie's one-add
primitive; every other add arrives in a run and takes `Bookie.add_run`. Both admit through
the ledger's descriptor. This measures what routing the lone add through `add_run` as an
AddRun of one would cost: the same requests, through the processor's real code and a real
Bookie (journal off, so the completion runs at once and only the loop's CPU is counted:
decode and socket excluded), process CPU time per add, the two forms alternated per round,
each round on a fresh ledger. The run-of-one form is built here, as the processor would
call it; it is not a production path.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time

from bk.bookie import Bookie
from bk.bookie.adds import AddRun
from bk.config import load_config
from bk.proto import AddRequest
from bk.server.processor import RequestProcessor, _add_measured


def _entry(ledger_id: int, entry_id: int, payload: bytes) -> bytes:
    return (ledger_id.to_bytes(8, "big", signed=True) + entry_id.to_bytes(8, "big", signed=True)
            + (-1).to_bytes(8, "big", signed=True) + len(payload).to_bytes(8, "big") + payload)


class _Conn:
    """The connection's side of an add, doing nothing (its cost is the same in both forms)."""

    def begin_add(self, nbytes: int) -> bool:
        return True

    def end_add(self, nbytes: int) -> None:
        pass

    def send_add_result(self, rc: int, req) -> None:
        pass


def _as_run_of_one(processor: RequestProcessor, req, conn) -> None:
    """RequestProcessor._add with the add handed over as an AddRun of one."""
    nbytes = len(req.body)
    if not conn.begin_add(nbytes):
        return
    processor.bookie.add_run(AddRun((req,), False), _run_of_one_done, (conn, nbytes, time.monotonic()))


def _run_of_one_done(ctx, reqs, err) -> None:
    conn, nbytes, start = ctx
    if err is not None or len(reqs) != 1:
        raise AssertionError(f"a lone add failed: {err!r}")
    conn.end_add(nbytes)
    conn.send_add_result(0, reqs[0])
    _add_measured(1, nbytes, start, err)  # as RequestProcessor._add_done


async def measure(n: int, rounds: int, entry_size: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        cfg = load_config(overrides=dict(journal_dirs=[d + "/journal"], ledger_dirs=[d + "/ledgers"],
                                         journal_write_data=False, flush_interval_ms=600_000,
                                         write_cache_max_size_bytes="1GiB"), env={})
        bookie = Bookie(cfg)
        await bookie.start()
        try:
            processor = RequestProcessor(bookie, cfg)
            conn, key, payload = _Conn(), b"k" * 20, b"x" * entry_size
            forms = {"add_entry_cb": processor._add, "run of one": lambda req, c: _as_run_of_one(processor, req, c)}
            out: dict = {name: [] for name in forms}
            ledger_id = 0
            for r in range(rounds):
                for name in (list(forms) if r % 2 == 0 else list(reversed(forms))):
                    ledger_id += 1
                    reqs = [AddRequest(0, key, ledger_id, e, _entry(ledger_id, e, payload)) for e in range(n)]
                    add = forms[name]
                    started = time.process_time()
                    for req in reqs:
                        add(req, conn)
                    out[name].append((time.process_time() - started) / n * 1e6)
        finally:
            await bookie.stop()
    return {"adds_per_round": n, "entry_size": entry_size,
            "us_per_add": {name: {"median": statistics.median(v), "rounds": v} for name, v in out.items()}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.lone_add", description=__doc__.split("\n\n")[0])
    ap.add_argument("--adds", type=int, default=50_000, help="adds per round and form")
    ap.add_argument("--rounds", type=int, default=8, help="rounds, the forms' order alternated")
    ap.add_argument("--entry-size", type=int, default=100, help="payload bytes")
    ap.add_argument("--json", metavar="PATH", help="write the figures here too")
    args = ap.parse_args(argv)
    result = asyncio.run(measure(args.adds, args.rounds, args.entry_size))
    for name, v in result["us_per_add"].items():
        print(f"{name:>13}: {v['median']:.2f} us of CPU per lone add (rounds: "
              + ", ".join(f"{x:.2f}" for x in v["rounds"]) + ")")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
