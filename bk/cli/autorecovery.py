"""`bk autorecovery --conf FILE`: run AutoRecovery (Auditor election + ReplicationWorker) on its own,
next to a bookie whose own `autorecovery_enabled` is false (BookKeeper's AutoRecoveryMain).

The config is the bookie's: its bookie id (advertised_address:bookie_port) is the
local bookie the worker copies to, and the autorecovery settings apply
(lost_bookie_recovery_delay_s, auditor_periodic_check_interval_s,
auditor_periodic_bookie_check_interval_s, open_ledger_rereplication_grace_period_ms,
rereplication_entry_batch_size, replication_rate_bytes_per_s). Runs until
SIGTERM or Ctrl-C, then releases its lock and vote and exits 0.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from bk import eventloop
from bk.config import BookieConfig, load_config

log = logging.getLogger("bk.autorecovery")


def add_parser(sub) -> None:
    p = sub.add_parser("autorecovery", help="run AutoRecovery (auditor + replication worker) for a bookie",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conf", metavar="FILE", help="the bookie's TOML settings file")
    p.add_argument("--set", dest="overrides", metavar="KEY=VALUE", action="append", default=[],
                   help="override one setting (repeatable)")
    p.set_defaults(func=run)


def run(args) -> int:
    cfg = load_config(args.conf, overrides=args.overrides)
    return eventloop.run(serve(cfg))


async def serve(cfg: BookieConfig) -> int:
    from bk.replication import AutoRecovery

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    autorecovery = await AutoRecovery(cfg).start()
    print(f"autorecovery for bookie {autorecovery.bookie_id} ready (metadata {cfg.metadata_service_uri})",
          flush=True)
    try:
        await stop.wait()
    finally:
        log.info("stopping autorecovery of %s", autorecovery.bookie_id)
        await autorecovery.stop()
    return 0
