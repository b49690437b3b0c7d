"""The pieces a bounded stop is made of (docs/OPERATIONS.md "Stopping"): `bounded_wait`
abandons what does not answer and names it, the disk-fault layer's hung fsync blocks until
healed, and shutdown_timeout_ms is checked. The whole stop, on real processes, is in
tests/integration/test_bookie_stop.py."""
from __future__ import annotations

import asyncio
import threading

import pytest

from bk import eventloop, fileio
from bk.config import load_config
from bk.errors import ConfigError
from bk.fileio import DurableFile
from bk.server.server import bounded_wait
from bk.testing.diskfaults import DiskFaults


def test_bounded_wait_abandons_what_never_answers_and_names_it():
    async def main():
        abandoned: list[str] = []
        never = asyncio.get_running_loop().create_future()
        assert await bounded_wait(never, 0.05, "deregistering", abandoned) is False
        assert abandoned == ["deregistering"]
        await asyncio.sleep(0)
        assert never.cancelled()

        async def fails():
            raise OSError("no route")
        assert await bounded_wait(fails(), 1.0, "closing the session", abandoned) is False
        assert abandoned[1].startswith("closing the session: ") and "no route" in abandoned[1]

        async def fine():
            return 1
        assert await bounded_wait(fine(), 1.0, "ok", abandoned) is True
        assert len(abandoned) == 2
    eventloop.run(main())


def test_bounded_wait_does_not_wait_for_a_cancellation_that_is_refused():
    """A step that swallows its cancellation (as a kazoo bridge or a thread may) is still left."""
    async def main():
        release = asyncio.Event()

        async def stubborn():
            while not release.is_set():
                try:
                    await release.wait()
                except asyncio.CancelledError:
                    continue  # refuses to stop
        abandoned: list[str] = []
        assert await bounded_wait(stubborn(), 0.05, "stubborn", abandoned) is False
        assert abandoned == ["stubborn"]
        release.set()
        await asyncio.sleep(0.01)
    eventloop.run(main())


def test_hung_fsync_blocks_until_healed(tmp_path):
    faults = DiskFaults.install()
    try:
        f = DurableFile(str(tmp_path / "a"))
        f.write(b"x" * 10)
        rule = faults.hang(op="fsync", path_prefix=str(tmp_path))
        done = threading.Event()
        t = threading.Thread(target=lambda: (f.fsync(), done.set()), daemon=True)
        t.start()
        assert not done.wait(0.3)  # hung (a bound, not a speed: it never returns while the rule holds)
        assert faults.hits(rule) == 1
        faults.heal(rule)
        assert done.wait(30)
        t.join(30)
        assert f.synced_size == 10  # then it goes on and succeeds
        f.close()
    finally:
        DiskFaults.uninstall()
    assert fileio.faults is None


def test_shutdown_timeout_setting():
    assert load_config(env={}).shutdown_timeout_ms == 30_000
    assert load_config(env={}, overrides=["shutdown_timeout_ms=3000"]).shutdown_timeout_ms == 3000
    with pytest.raises(ConfigError, match="shutdown_timeout_ms"):
        load_config(env={}, overrides=["shutdown_timeout_ms=0"])
