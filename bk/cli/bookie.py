"""`bk bookie`: run one bookie until SIGTERM or Ctrl-C, then stop within shutdown_timeout_ms.

Exit status (bk.cli.stopping, docs/OPERATIONS.md): 0 clean (everything durable, the
unclean-shutdown flag cleared), 3 stopped but not cleanly (the final checkpoint failed or
was abandoned at the deadline: the flag stays set; the log says what was abandoned), 4 a
second SIGTERM/SIGINT (left at once), 1 an error (a failed start)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os

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
  shutdown_timeout_ms    30000   (SIGTERM: gone by then whatever ZooKeeper or a disk do; exit 0 clean,
                                  3 not clean: flag left set; a second signal exits at once, 4)
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
    return eventloop.run(serve(cfg, config_source=(args.conf, args.overrides)))


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


async def serve(cfg: BookieConfig, config_source: tuple | None = None) -> int:
    from bk.server import BookieServer

    from .stopping import EXIT_CLEAN, EXIT_UNCLEAN, StopControl

    if cfg.raise_open_files_limit:
        raise_open_files_limit()
    server = BookieServer(cfg)
    if os.environ.get("BK_TEST_BREAK"):  # tests only: a bookie broken on purpose (bk.testing.breaks)
        from bk.testing.breaks import apply_from_env
        apply_from_env(server.bookie)
    if os.environ.get("BK_TEST_STORAGE_WATCH"):  # tests only: a chaos run watches stores and checkpoints
        from bk.testing.chaos.excuse import watch_from_env
        watch_from_env(server.bookie)
    # (config file, --set overrides) it was built from: HTTP expand_storage reads them again
    server.config_source = config_source

    def status() -> int:
        """Clean only once a final checkpoint cleared the unclean-shutdown flag (or the storage
        was never opened, so the flag is as the last run left it)."""
        bookie = server.bookie
        return EXIT_CLEAN if bookie.stopped_clean or bookie.storage is None else EXIT_UNCLEAN

    control = StopControl(f"bookie {cfg.bookie_id}", cfg.shutdown_timeout_ms, status,
                          doing=lambda: server.stop_step or "the stop").install()
    # A start can wait long (phase one over a large cluster, the old session's expiry
    # before registering): a stop asked for meanwhile abandons it at once. The server's
    # start tears down what it began (bounded like a stop); BP-46's unclean-shutdown flag
    # survives an abandoned phase one (Bookie.phase_one_due).
    starting = asyncio.ensure_future(server.start())
    stopping = asyncio.ensure_future(control.requested.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        log.warning("stop requested while bookie %s was starting: abandoning the start", cfg.bookie_id)
        server.stop_deadline = control.deadline()
        starting.cancel()
        await asyncio.wait({starting})  # its teardown is bounded by the deadline
        return control.finish(status(), server.stop_abandoned)
    stopping.cancel()
    if starting.exception() is not None and server.stop_abandoned:
        # the failed start's teardown left threads waiting (on ZooKeeper, a disk): do not join them
        from .stopping import exit_now
        log.error("bookie %s failed to start (%s); its teardown abandoned: %s", cfg.bookie_id,
                  starting.exception(), "; ".join(server.stop_abandoned))
        exit_now(1)
    starting.result()  # a failed start raises here
    eventloop.tune_gc()  # start-up objects out of the GC's sight; fewer young collections
    http = f", HTTP admin {server.http.url}" if server.http is not None else ""
    print(f"bookie {cfg.bookie_id} ready (metadata {cfg.metadata_service_uri}{http})", flush=True)
    await control.requested.wait()
    log.info("stopping bookie %s", cfg.bookie_id)
    abandoned = await server.stop(control.deadline())
    return control.finish(status(), abandoned)
