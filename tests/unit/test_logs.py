"""bk.cli.logs: per-logger levels, JSON lines, rotation by size, the bookie id on each line."""
import json
import logging
import os

import pytest

from bk.cli.logs import setup_logging
from bk.errors import ConfigError


@pytest.fixture(autouse=True)
def restore_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)
    for name in ("bk.test.loud", "bk.test.quiet"):
        logging.getLogger(name).setLevel(logging.NOTSET)


def test_json_lines_with_bookie_id_and_levels_per_logger(tmp_path):
    path = str(tmp_path / "bookie.log")
    setup_logging("WARNING,bk.test.loud=DEBUG", log_file=path, log_format="json", bookie_id="127.0.0.1:3181")
    logging.getLogger("bk.test.loud").debug("shown %d", 1)
    logging.getLogger("bk.test.quiet").info("hidden")
    logging.getLogger("bk.test.quiet").error("shown too")
    lines = [json.loads(line) for line in open(path)]
    assert [(r["logger"], r["level"], r["message"]) for r in lines] == [
        ("bk.test.loud", "DEBUG", "shown 1"), ("bk.test.quiet", "ERROR", "shown too")]
    assert all(r["bookie_id"] == "127.0.0.1:3181" and r["ts"] for r in lines)


def test_text_lines_rotate_by_size(tmp_path):
    path = str(tmp_path / "bookie.log")
    setup_logging("INFO", log_file=path, max_bytes=2000, backups=2, bookie_id="b:1")
    for i in range(200):
        logging.getLogger("bk.test.loud").info("line %d of some length to fill the file", i)
    names = sorted(os.listdir(tmp_path))
    assert names == ["bookie.log", "bookie.log.1", "bookie.log.2"]
    assert all(os.path.getsize(tmp_path / n) <= 2000 for n in names)
    last = open(path).read().splitlines()[-1]
    assert " INFO [b:1] bk.test.loud: line 199 " in last


def test_bad_levels_are_refused():
    with pytest.raises(ConfigError, match="LOUD"):
        setup_logging("INFO,bk=LOUD")
