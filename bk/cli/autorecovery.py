"""`bk autorecovery --conf FILE`: run AutoRecovery (Auditor election + ReplicationWorker) on its own,
next to a bookie whose own `autorecovery_enabled` is false (BookKeeper's AutoRecoveryMain).

The config is the bookie's: its bookie id (advertised_address:bookie_port) is the
local bookie the worker copies to, and the autorecovery settings apply
(lost_bookie_recovery_delay_s, auditor_periodic_check_interval_s,
auditor_periodic_bookie_check_interval_s, auditor_periodic_placement_policy_check_interval_s,
repaired_placement_policy_not_adhering_bookie_enable, open_ledger_rereplication_grace_period_ms,
rereplication_entry_batch_size, replication_rate_bytes_per_s). Runs until
SIGTERM or Ctrl-C, then releases its lock and vote within shutdown_timeout_ms: exit 0
when it did, 3 when it had to abandon that (ZooKeeper down or paused: the lock and vote
end with the session; the log says what was abandoned), 4 on a second signal (at once).

Logs as `bk bookie` does (log_level unless --log-level is given, log_format, rotation), to
log_file with "-autorecovery" before its extension (bookie.log -> bookie-autorecovery.log):
two processes must not rotate one file. With autorecovery_metrics_port (-1 = off, the
default; 0 = any free port) it serves GET /metrics (the auditor_* and replication_worker_*
metrics, in prometheus_latency_shape) on http_server_address (empty: 127.0.0.1); the ready
line then ends with "metrics http://HOST:PORT/metrics".
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os

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
    from .logs import setup_logging

    cfg = load_config(args.conf, overrides=args.overrides)
    setup_logging(getattr(args, "log_level", None) or cfg.log_level, log_file=own_log_file(cfg.log_file),
                  log_format=cfg.log_format, max_bytes=cfg.log_file_max_size_bytes, backups=cfg.log_file_backups,
                  bookie_id=cfg.bookie_id)
    return eventloop.run(serve(cfg))


def own_log_file(log_file: str) -> str:
    """The bookie's log_file with "-autorecovery" before its extension ("" stays stderr)."""
    if not log_file:
        return ""
    stem, ext = os.path.splitext(log_file)
    return f"{stem}-autorecovery{ext}"


async def serve(cfg: BookieConfig) -> int:
    from bk import metrics
    from bk.server.metrics_http import MetricsServer

    from .stopping import EXIT_UNCLEAN, StopControl

    abandoned: list[str] = []
    step = ["starting"]
    control = StopControl(f"autorecovery of {cfg.bookie_id}", cfg.shutdown_timeout_ms,
                          lambda: EXIT_UNCLEAN, doing=lambda: step[0]).install()
    metrics.set_enabled(cfg.metrics_enabled)
    metrics.set_latency_shape(cfg.prometheus_latency_shape)
    metrics_server = await MetricsServer(cfg).start() if cfg.autorecovery_metrics_port >= 0 else None
    try:
        return await _serve(cfg, control, abandoned, step, metrics_server)
    finally:
        if metrics_server is not None:
            await metrics_server.stop()


async def _serve(cfg, control, abandoned, step, metrics_server) -> int:
    from bk.replication import AutoRecovery
    from bk.server.server import bounded_wait

    from .stopping import EXIT_CLEAN, EXIT_UNCLEAN

    autorecovery = AutoRecovery(cfg)
    starting = asyncio.ensure_future(autorecovery.start())
    stopping = asyncio.ensure_future(control.requested.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if starting.done():
        stopping.cancel()
        starting.result()  # a failed start raises here
        print(f"autorecovery for bookie {autorecovery.bookie_id} ready (metadata {cfg.metadata_service_uri})"
              + (f" metrics {metrics_server.url}" if metrics_server is not None else ""), flush=True)
        await control.requested.wait()
    else:
        starting.cancel()  # a start waiting on ZooKeeper: given up at once
        await asyncio.wait({starting}, timeout=max(0.0, control.deadline() - asyncio.get_running_loop().time()))
    log.info("stopping autorecovery of %s", autorecovery.bookie_id)
    step[0] = "releasing the replication lock and the auditor vote"
    loop = asyncio.get_running_loop()
    await bounded_wait(autorecovery.stop(), control.deadline() - loop.time(),
                       "releasing the replication lock and the auditor vote (they end with the session)", abandoned)
    return control.finish(EXIT_UNCLEAN if abandoned else EXIT_CLEAN, abandoned)
