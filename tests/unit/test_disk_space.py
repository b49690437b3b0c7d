"""One definition of disk space (bk.fileio) behind every surface that reports it.

The wire's GetBookieInfo, the HTTP /api/v1/bookie/info and the disk checker (with the entry
logger's and GC's per-dir usage) must agree for the same dirs, as BookKeeper's do (DiskChecker:
usable space, not root's reserve; each filesystem counted once however many ledger dirs it
holds), and none of them may call statvfs on the event loop. A fake statvfs (bk.testing.fakedisk)
gives known figures: two ledger dirs on one filesystem, a third on another, the journal on a
third, with root reserves that a reader of f_bfree would count.
"""
import asyncio
import json
import os
from types import SimpleNamespace

import pytest

from bk import fileio
from bk.config import load_config
from bk.entrylog.logger import EntryLogger
from bk.proto import GetBookieInfoRequest
from bk.formats.wire import BOOKIE_INFO_FREE_DISK_SPACE, BOOKIE_INFO_TOTAL_DISK_CAPACITY
from bk.server import http_handlers
from bk.server.operations import Operations
from bk.server.server import BookieServer
from bk.testing.fakedisk import FakeStatvfs


@pytest.fixture
def disks(tmp_path):
    a, b, j = tmp_path / "fs-a", tmp_path / "fs-b", tmp_path / "fs-j"
    dirs = {"ledger_dirs": [str(a / "l1"), str(a / "l2"), str(b / "l3")], "journal_dirs": [str(j / "journal")]}
    for d in (*dirs["ledger_dirs"], *dirs["journal_dirs"]):
        (tmp_path / d).mkdir(parents=True)
    with FakeStatvfs() as fake:
        fake.mount(str(a), total_bytes=10_000, free_bytes=3_000, reserved_bytes=500)  # usage 0.70
        fake.mount(str(b), total_bytes=4_000, free_bytes=100, reserved_bytes=200)  # usage 0.975
        fake.mount(str(j), total_bytes=2_000, free_bytes=1_000)  # usage 0.50
        cfg = load_config(env={}, overrides={**dirs, "disk_usage_threshold": 0.95, "disk_usage_lwm_threshold": 0.9})
        yield fake, cfg


# each filesystem once (fs-a holds two ledger dirs), usable bytes (f_bavail), the journal's not at all
FREE, TOTAL = 3_000 + 100, 10_000 + 4_000


def test_total_space_counts_each_filesystem_once_and_usable_bytes(disks):
    _, cfg = disks
    space = fileio.total_space(cfg.ledger_dirs)
    assert (space.free_bytes, space.total_bytes) == (FREE, TOTAL)
    assert space.usage == pytest.approx(1 - FREE / TOTAL)


def test_http_reports_total_space_off_the_loop(disks):
    fake, cfg = disks
    admin = SimpleNamespace(config=cfg, run_blocking=lambda fn, *a: asyncio.to_thread(fn, *a))

    async def http():
        return json.loads((await http_handlers.bookie_info(admin, None)).text)

    info = asyncio.run(http())
    assert (info["freeSpace"], info["totalSpace"]) == (FREE, TOTAL)
    assert fake.calls and fake.calls_on_loop == []


def test_wire_reports_what_http_reports_off_the_loop(disks):
    """GET_BOOKIE_INFO (one handler for v2 and v3) answers the HTTP figures, each bit as asked."""
    fake, cfg = disks
    ops = Operations(SimpleNamespace(), cfg)

    async def ask(bits):
        return await ops.bookie_info(GetBookieInfoRequest(0, bits))

    both = asyncio.run(ask(BOOKIE_INFO_FREE_DISK_SPACE | BOOKIE_INFO_TOTAL_DISK_CAPACITY))
    assert (both.free_disk_bytes, both.total_disk_bytes) == (FREE, TOTAL)
    free_only = asyncio.run(ask(BOOKIE_INFO_FREE_DISK_SPACE))
    assert (free_only.free_disk_bytes, free_only.total_disk_bytes) == (FREE, 0)
    assert fake.calls and fake.calls_on_loop == []
    assert fake.threads == {"bk-disk-space"}  # not a worker of the default executor (the read path's)


def _checked_server(cfg):
    states = []
    server = SimpleNamespace(config=cfg, _forced_read_only=False, _writable_dirs=0,
                             bookie=SimpleNamespace(set_read_only=lambda ro, why="": states.append((ro, why))))
    return server, states


def test_disk_checker_entry_logger_and_gc_see_the_same_per_dir_usage(disks):
    """fs-b (l3) is over disk_usage_threshold: the checker counts 2 writable ledger dirs and
    the bookie stays writable, as BookKeeper's LedgerDirsMonitor keeps it while any ledger
    dir is writable (before, bk turned read-only on the fullest dir); the entry logger puts
    its next log on a dir under the threshold. GC reads the same per-dir figures."""
    fake, cfg = disks
    server, states = _checked_server(cfg)
    asyncio.run(BookieServer._check_disks(server))
    assert server._writable_dirs == 2
    assert states == [(False, "")]
    assert fake.calls_on_loop == [] and fake.threads == {"bk-disk-space"}

    el = EntryLogger(list(cfg.ledger_dirs), cfg)
    try:
        usage = {d: round(u.usage, 6) for d, u in el.disk_usage().items()}
        new_log_dir = el._pick_dir()
    finally:
        el.close()
    l1, l2, l3 = cfg.ledger_dirs
    assert usage == {l1: 0.7, l2: 0.7, l3: 0.975}
    assert new_log_dir in (l1, l2)  # under the threshold, most usable bytes

    fake.mount(os.path.dirname(l3), total_bytes=4_000, free_bytes=2_000)  # space freed on fs-b
    asyncio.run(BookieServer._check_disks(server))
    assert server._writable_dirs == 3 and states[-1] == (False, "")


def test_read_only_when_every_ledger_dir_is_full_and_writable_below_the_low_water_mark(disks):
    fake, cfg = disks
    l1, l2, l3 = cfg.ledger_dirs
    fs_a, fs_b = os.path.dirname(l1), os.path.dirname(l3)
    fake.mount(fs_a, total_bytes=10_000, free_bytes=400)  # 96%: both of its dirs full, fs-b too
    server, states = _checked_server(cfg)
    asyncio.run(BookieServer._check_disks(server))
    assert server._writable_dirs == 0
    assert states == [(True, "every ledger dir's disk usage >= disk_usage_threshold (the least full: 96%)")]

    fake.mount(fs_a, total_bytes=10_000, free_bytes=800)  # 92%: writable dirs again, above the lwm (90%)
    asyncio.run(BookieServer._check_disks(server))
    assert server._writable_dirs == 2 and len(states) == 1  # no verdict: it stays read-only for now

    fake.mount(fs_a, total_bytes=10_000, free_bytes=3_000)  # 70%
    asyncio.run(BookieServer._check_disks(server))
    assert states[-1] == (False, "")


def test_a_full_journal_dir_makes_the_bookie_read_only(disks):
    fake, cfg = disks
    fs_j = os.path.dirname(cfg.journal_dirs[0])
    fake.mount(fs_j, total_bytes=2_000, free_bytes=50)  # 97.5%
    server, states = _checked_server(cfg)
    asyncio.run(BookieServer._check_disks(server))
    assert server._writable_dirs == 2  # the ledger dirs are not the reason
    assert states == [(True, "journal disk usage 98% >= disk_usage_threshold")]
    fake.mount(fs_j, total_bytes=2_000, free_bytes=1_000)
    asyncio.run(BookieServer._check_disks(server))
    assert states[-1] == (False, "")


def test_the_disk_space_thread_hands_back_errors(disks):
    """A dir statvfs cannot read (here: on no fake filesystem) fails the awaiting caller, and
    the thread goes on serving the next one."""
    _, cfg = disks

    async def run():
        with pytest.raises(FileNotFoundError):
            await fileio.on_space_thread(fileio.disk_space, "/no/such/fake/dir")
        return await fileio.on_space_thread(fileio.total_space, cfg.ledger_dirs)

    space = asyncio.run(run())
    assert (space.free_bytes, space.total_bytes) == (FREE, TOTAL)


def test_a_forked_child_gets_its_own_disk_space_thread(tmp_path):
    """The chaos runner forks its workers from a process whose bookies started the disk-space
    thread: the child has the queue but not the thread, so its first statvfs waited for ever
    (every chaos test timed out in CI after other tests had run in the same worker)."""
    async def space():
        return await asyncio.wait_for(fileio.on_space_thread(fileio.disk_space, str(tmp_path)), 10)

    asyncio.run(space())  # the thread runs in this process now
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if its call is answered
        try:
            asyncio.run(space())
            code = 0
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
