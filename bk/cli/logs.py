"""Logging set-up for the `bk` processes: levels per logger, text or JSON lines, a log file
rotated by size, and the bookie id on every line.

    setup_logging("INFO,bk.journal=DEBUG")                       the command line's --log-level
    setup_logging(cfg.log_level, log_file=cfg.log_file, log_format=cfg.log_format,
                  max_bytes=cfg.log_file_max_size_bytes, backups=cfg.log_file_backups,
                  bookie_id=cfg.bookie_id)                       `bk bookie`

Text lines: `2026-01-01 12:00:00,123 INFO [127.0.0.1:3181] bk.server.server: message`.
JSON lines: one object a line with ts, level, logger, bookie_id, message (and exc_info).
"""
from __future__ import annotations

import json
import logging
import logging.handlers
import sys

from bk.config import parse_log_levels
from bk.errors import ConfigError

TEXT_FORMAT = "%(asctime)s %(levelname)s [%(bookie_id)s] %(name)s: %(message)s"
# ZooKeeper connects and closes are not news for an operator at INFO
QUIET_AT_INFO = ("kazoo", "bk.meta.kazoo")


class _BookieIdFilter(logging.Filter):
    def __init__(self, bookie_id: str):
        super().__init__()
        self.bookie_id = bookie_id

    def filter(self, record: logging.LogRecord) -> bool:
        record.bookie_id = self.bookie_id
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": self.formatTime(record), "level": record.levelname, "logger": record.name,
               "bookie_id": getattr(record, "bookie_id", "-"), "message": record.getMessage()}
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(levels: str = "INFO", *, log_file: str = "", log_format: str = "text", max_bytes: int = 0,
                  backups: int = 5, bookie_id: str = "-") -> None:
    """(Re)configure the root logger; safe to call again (the bookie does, once it has its config)."""
    try:
        root_level, per_logger = parse_log_levels(levels)
    except ValueError as e:
        raise ConfigError(f"bad log level {levels!r}: {e}") from None
    if log_file:
        handler: logging.Handler = logging.handlers.RotatingFileHandler(
            log_file, maxBytes=max_bytes, backupCount=backups if max_bytes else 0, encoding="utf-8")
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(_BookieIdFilter(bookie_id))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(root_level)
    if root_level == "INFO":
        for name in QUIET_AT_INFO:
            logging.getLogger(name).setLevel(logging.WARNING)
    for name, level in per_logger.items():
        logging.getLogger(name).setLevel(level)
