"""`bk standalone` keeps its ports across restarts: ZooKeeper 2181 and bookie 3181 when free
(else free ports, said on stderr), and prints each bookie's HTTP admin address, which answers."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = pytest.mark.integration


def run_standalone(data_dir: str) -> tuple[str, str]:
    proc = subprocess.Popen([sys.executable, "-m", "bk.cli.main", "--log-level", "WARNING", "standalone",
                             "--bookies", "1", "--data-dir", data_dir],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            out.append(line)
            if line.startswith("Press Ctrl-C"):
                break
        text = "".join(out)
        assert "bk standalone is running" in text, text + proc.stderr.read() if proc.poll() is not None else text
        url = re.search(r"HTTP admin   : (\S+)", text).group(1)
        with urllib.request.urlopen(url + "/heartbeat", timeout=10) as resp:
            assert resp.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return text, err


@pytest.fixture
def default_ports():
    """No other test process runs `bk standalone` on the default ports meanwhile (xdist workers)."""
    from bk.testing.ports import well_known_ports
    with well_known_ports():
        yield


def test_standalone_ports_are_stable_and_http_is_printed(tmp_path, default_ports):
    from bk.testing.ports import port_is_free

    zk_free, bookie_free = port_is_free(2181), port_is_free(3181)
    first, err = run_standalone(str(tmp_path / "sa"))
    uri = re.search(r"metadata URI : (\S+)", first).group(1)
    bookie = re.search(r"bookies      : (\S+)", first).group(1)
    http = re.search(r"HTTP admin   : (\S+)", first).group(1)
    # the well-known ports when they were free, else a note on stderr (another process may race us)
    assert uri == "zk://127.0.0.1:2181/ledgers" or (not zk_free or "2181 is taken" in err)
    assert bookie == "127.0.0.1:3181" or (not bookie_free or "3181 is taken" in err)
    second, _ = run_standalone(str(tmp_path / "sa"))
    assert f"metadata URI : {uri}" in second and f"bookies      : {bookie}" in second
    assert f"HTTP admin   : {http}" in second
