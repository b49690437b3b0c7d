"""v2 against v3, and TLS against plain: adds/s of the same load, side by side, in one run.

    python -m bench.protocols                       # 3 rounds of 8 s each: v2, v3, v2+TLS, v3+TLS
    python -m bench.protocols --rounds 5 --duration-s 10 --entry-size 100 --json out.json

One LocalCluster (one bookie, TLS configured with certificates made for the run,
START_TLS served on the same port) and one writer in this process
(bench.load.run_writer). The variants run one after the other inside each round
(alternated, so a shared machine's drift hits all of them alike); the summary
gives each variant's median adds/s and median p99 latency over the rounds,
and every round's figures.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from .load import ADD_WINDOW, LoadSpec, bookie_pids, local_cluster, run_load
from .procmem import RssSampler
from .stats import parse_size, positive_float, positive_int

VARIANTS = ("v2", "v3", "v2+tls", "v3+tls")


def _certs(directory: str) -> dict:
    from bk.testing.certs import make_ca, make_cert, write_pem
    ca = make_ca()
    key, cert = make_cert(ca, "bookie", dns=("localhost",), ips=("127.0.0.1",))
    return {"ca": write_pem(os.path.join(directory, "ca.pem"), cert=ca[1]),
            "cert": write_pem(os.path.join(directory, "bookie.pem"), cert=cert),
            "key": write_pem(os.path.join(directory, "bookie.key"), key=key)}


def client_options(variant: str, certs: dict) -> tuple:
    protocol, _, tls = variant.partition("+")
    opts = [("protocol", protocol)]
    if tls:
        opts.append(("tls_trust_store", certs["ca"]))
    return tuple(opts)


def run(rounds: int, spec: LoadSpec, variants=VARIANTS) -> dict:
    from . import scratch_dir
    cert_dir = scratch_dir("certs")
    certs = _certs(cert_dir)
    runs: dict[str, list] = {v: [] for v in variants}
    with local_cluster(1, prefix="protocols", tls_certificate_path=certs["cert"], tls_key_store=certs["key"]) as c:
        for r in range(rounds):
            for v in variants:
                with RssSampler(bookie_pids(c)) as rss:
                    s = run_load(c.metadata_uri, LoadSpec(**{**spec.__dict__, "client": client_options(v, certs)}),
                                 on_mark=rss.mark)
                adds = s["adds"]
                n = max(adds["entries"], 1)
                # CPU per add (client + bookie) holds up on a shared host where adds/s swings
                bookie_pct = sum(x for x in rss.cpu_pct(between=ADD_WINDOW).values() if x)
                row = {"adds_per_s": adds["entries_per_s"], "p99_ms": adds["latency_ms"]["p99"],
                       "client_cpu_us": adds["client_cpu_pct"] / 100.0 * adds["elapsed_s"] / n * 1e6,
                       "bookie_cpu_us": bookie_pct / 100.0 * adds["elapsed_s"] / n * 1e6, "errors": adds["errors"]}
                runs[v].append(row)
                print(f"round {r + 1} {v:7s} {row['adds_per_s']:10.0f} adds/s  p99 {row['p99_ms']:.2f} ms  CPU/add"
                      f" client {row['client_cpu_us']:.1f} us bookie {row['bookie_cpu_us']:.1f} us", file=sys.stderr)
    first = variants[0]
    return {"spec": {k: v for k, v in spec.__dict__.items() if k != "client"}, "rounds": rounds,
            "median": {v: {**{k: statistics.median(x[k] for x in rs)
                              for k in ("adds_per_s", "p99_ms", "client_cpu_us", "bookie_cpu_us")},
                           # adds/s against the first variant of the same round (paired: drift cancels)
                           f"ratio_to_{first}": statistics.median(x["adds_per_s"] / y["adds_per_s"]
                                                                  for x, y in zip(rs, runs[first]))}
                       for v, rs in runs.items()},
            "runs": runs}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.protocols", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=positive_int, default=3)
    p.add_argument("--duration-s", type=positive_float, default=8.0)
    p.add_argument("--entry-size", type=parse_size, default=1024)
    p.add_argument("--in-flight", type=positive_int, default=1000)
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        p.error(f"unknown variants {bad}")
    spec = LoadSpec(duration_s=args.duration_s, entry_size=args.entry_size, in_flight=args.in_flight)
    out = run(args.rounds, spec, variants)
    first = variants[0]
    for v, m in out["median"].items():
        print(f"{v:7s} median {m['adds_per_s']:10.0f} adds/s ({m[f'ratio_to_{first}']:.2f}x {first} in the same"
              f" round)  p99 {m['p99_ms']:.2f} ms  CPU/add client {m['client_cpu_us']:.1f} us"
              f" bookie {m['bookie_cpu_us']:.1f} us")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return 1 if any(x["errors"] for rs in out["runs"].values() for x in rs) else 0


if __name__ == "__main__":
    sys.exit(main())
