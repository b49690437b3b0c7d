"""`bk bookie`: run one bookie until SIGTERM or Ctrl-C, then stop cleanly (exit 0)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal

from bk import eventloop
from bk.config import BookieConfig, load_config, setting_names

log = logging.getLogger("bk.bookie")

CONF_HELP = """\
Settings come from (lowest to highest): defaults, the TOML file (flat snake_case
keys), environment variables BK_<KEY>, then --set key=value. Unknown keys and bad
values are errors naming the key. The main keys:

  metadata_service_uri   zk://127.0.0.1:2181/ledgers   (or mem://name/ledgers in-process)
  bookie_port            3181
  advertised_address     127.0.0.1                     (the bookie id is address:port)
  journal_dirs           ["data/journal"]
  ledger_dirs            ["data/ledgers"]
  journal_write_data     true    (false = BP-46: entries skip the journal; docs/JOURNAL-OFF.md)
  data_integrity_checking_enabled      auto   (on when the journal is off: after a crash or a
                                               wiped disk, fence + limbo at boot, self-repair)
  data_integrity_cookie_stamping_enabled false (true: a wiped bookie stamps new cookies itself)
  journal_sync_data      true    (false = no fsync: unsafe, for tests only)
  flush_interval_ms      1000
  write_cache_max_size_bytes 64MiB, read_cache_max_size_bytes 64MiB
  autorecovery_enabled   false

All settings: """


def add_parser(sub) -> None:
    p = sub.add_parser("bookie", help="run a bookie", description="Run one bookie (storage node).",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=CONF_HELP + ", ".join(setting_names()))
    p.add_argument("--conf", metavar="FILE", help="TOML settings file")
    p.add_argument("--set", dest="overrides", metavar="KEY=VALUE", action="append", default=[],
                   help="override one setting (repeatable)")
    p.set_defaults(func=run)


def run(args) -> int:
    from .logs import setup_logging

    cfg = load_config(args.conf, overrides=args.overrides)
    if os.environ.get("BK_DISK_FAULTS"):  # tests only: injected disk faults (bk.testing.diskfaults)
        from bk.testing.diskfaults import install_from_env
        install_from_env()
    setup_logging(args.log_level or cfg.log_level, log_file=cfg.log_file, log_format=cfg.log_format,
                  max_bytes=cfg.log_file_max_size_bytes, backups=cfg.log_file_backups, bookie_id=cfg.bookie_id)
    return eventloop.run(serve(cfg))


def raise_open_files_limit() -> tuple[int, int]:
    """Soft RLIMIT_NOFILE up to the hard limit (every client connection is a descriptor),
    as servers do at start; returns and logs (soft, hard)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("could not raise the open-files limit from %d to %d: %s", soft, target, e)
    log.info("open-files limit %d (hard %s)", soft, "unlimited" if hard == resource.RLIM_INFINITY else hard)
    return soft, hard


async def serve(cfg: BookieConfig) -> int:
    from bk.server import BookieServer

    if cfg.raise_open_files_limit:
        raise_open_files_limit()
    server = BookieServer(cfg)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # A start can wait long (phase one over a large cluster, the old session's expiry
    # before registering): a stop asked for meanwhile abandons it at once. The server's
    # start tears down what it began; BP-46's unclean-shutdown flag survives an
    # abandoned phase one (Bookie.phase_one_due).
    starting = asyncio.ensure_future(server.start())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        log.warning("stop requested while bookie %s was starting: abandoning the start", cfg.bookie_id)
        starting.cancel()
        try:
            await starting
        except asyncio.CancelledError:
            pass
        return 0
    stopping.cancel()
    starting.result()  # a failed start raises here
    eventloop.tune_gc()  # start-up objects out of the GC's sight; fewer young collections
    http = f", HTTP admin {server.http.url}" if server.http is not None else ""
    print(f"bookie {cfg.bookie_id} ready (metadata {cfg.metadata_service_uri}{http})", flush=True)
    await stop.wait()
    log.info("stopping bookie %s", cfg.bookie_id)
    await server.stop()
    return 0
