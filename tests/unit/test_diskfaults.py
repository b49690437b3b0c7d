"""bk.testing.diskfaults: the injection layer itself (bk.fileio's hook), in-process and
through a control file in a child process, and the corruption helpers. The storage
layers' answers to the faults are in test_diskfault_storage.py."""
import errno
import os
import struct
import subprocess
import sys
import textwrap

import pytest

from bk import fileio
from bk.errors import DiskFullError, StorageError, SyncFailedError
from bk.fileio import DurableFile, atomic_write, disk_space, fsync_dir
from bk.testing.diskfaults import DiskFaultControl, DiskFaults, flip_bit


@pytest.fixture
def faults():
    f = DiskFaults.install()
    yield f
    DiskFaults.uninstall()
    assert fileio.faults is None


def test_off_by_default():
    assert fileio.faults is None


def test_fsync_eio_once_then_file_refuses_every_later_fsync(tmp_path, faults):
    f = DurableFile(str(tmp_path / "a"))
    f.write(b"x" * 100)
    f.fsync()
    f.write(b"y" * 50)
    rule = faults.fail(op="fsync", errno=errno.EIO, path_prefix=str(tmp_path), count=1)
    with pytest.raises(SyncFailedError):
        f.fsync()
    assert faults.hits(rule) == 1
    assert f.synced_size == 100
    # the rule is spent, but the file must never claim durability again (fsyncgate)
    with pytest.raises(SyncFailedError, match="earlier fsync failed"):
        f.fsync()
    assert faults.hits(rule) == 1
    # drop_unsynced: what the failed fsync covered is gone from the page cache
    with open(f.path, "rb") as fh:
        data = fh.read()
    assert data == b"x" * 100 + bytes(50)
    # another file is not affected
    g = DurableFile(str(tmp_path / "b"))
    g.write(b"z")
    g.fsync()
    f.close()
    g.close()


def test_keep_unsynced_and_prefix_and_after(tmp_path, faults):
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    inside = DurableFile(str(tmp_path / "in" / "f"))
    outside = DurableFile(str(tmp_path / "out" / "f"))
    rule = faults.fail(op="fsync", path_prefix=str(tmp_path / "in"), count=1, after=1, drop_unsynced=False)
    inside.write(b"1")
    outside.write(b"1")
    outside.fsync()
    inside.fsync()  # skipped by after=1
    inside.write(b"2")
    with pytest.raises(SyncFailedError):
        inside.fsync()
    assert open(inside.path, "rb").read() == b"12"
    assert faults.hits(rule) == 1
    outside.write(b"2")
    outside.fsync()


def test_write_enospc_forever_until_healed(tmp_path, faults):
    f = DurableFile(str(tmp_path / "a"))
    rule = faults.fail(op="write", errno=errno.ENOSPC, path_prefix=str(tmp_path), count=None, partial_bytes=7)
    for _ in range(3):
        with pytest.raises(DiskFullError):
            f.write(b"abc")
    assert faults.hits(rule) == 3
    assert f.size == 21  # the junk of three short writes: its owner must cut it
    with pytest.raises(DiskFullError):
        f.writev([b"a", b"b"])
    with pytest.raises(DiskFullError):
        DurableFile(str(tmp_path / "b"))
    with pytest.raises(DiskFullError):
        atomic_write(str(tmp_path / "c"), b"data")
    faults.heal(rule)
    f.truncate(0)
    f.write(b"abc")
    f.fsync()
    assert open(f.path, "rb").read() == b"abc"


def test_full_disk_reports_space_and_refuses_writes_not_reads(tmp_path, faults):
    d = tmp_path / "disk"
    d.mkdir()
    f = DurableFile(str(d / "a"))
    f.write(b"data")
    f.fsync()
    assert disk_space(str(d)).usage < 1.0
    rule = faults.full_disk(str(d))
    assert disk_space(str(d)).usage == 1.0
    assert disk_space(str(d / "sub")).free_bytes == 0
    assert disk_space(str(tmp_path / "elsewhere")).usage < 1.0 if (tmp_path / "elsewhere").mkdir() is None else True
    with pytest.raises(DiskFullError):
        f.write(b"more")
    with pytest.raises(StorageError):
        fileio.check_commit(str(d / "index"))
    fileio.check_read(str(d / "a"))  # reads go on
    f.fsync()  # nothing new to sync: fsync of written data goes on
    faults.heal(rule)
    assert disk_space(str(d)).usage < 1.0
    f.write(b"more")


def test_dir_fsync_and_commit_and_read_faults(tmp_path, faults):
    faults.fail(op="fsync", path_prefix=str(tmp_path), count=1)
    with pytest.raises(SyncFailedError):
        fsync_dir(str(tmp_path))
    faults.fail(op="commit", errno=errno.EIO, count=1)
    with pytest.raises(StorageError):
        fileio.check_commit(str(tmp_path))
    fileio.check_commit(str(tmp_path))
    faults.fail(op="read", errno=errno.EIO, path_prefix=str(tmp_path), count=1)
    with pytest.raises(OSError):
        fileio.check_read(str(tmp_path / "x"))


def test_bad_rules_are_refused(faults):
    with pytest.raises(ValueError):
        faults.fail(op="unlink")
    with pytest.raises(ValueError):
        faults.fail(op="write", count=0)


def test_control_file_drives_a_child_process(tmp_path):
    ctl = DiskFaultControl(str(tmp_path / "faults.json"))
    data = tmp_path / "data"
    data.mkdir()
    script = textwrap.dedent(f"""
        import os, sys, time
        from bk.testing.diskfaults import install_from_env
        from bk.fileio import DurableFile
        from bk.errors import StorageError
        assert install_from_env()
        f = DurableFile({str(data / 'f')!r})
        for step in range(3):
            sys.stdin.readline()
            f.write(b"x")
            try:
                f.fsync()
                print("ok", flush=True)
            except StorageError as e:
                print(type(e).__name__, flush=True)
    """)
    env = {**os.environ, **ctl.env()}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)

    def step() -> str:
        proc.stdin.write("go\n")
        proc.stdin.flush()
        return proc.stdout.readline().strip()

    try:
        assert step() == "ok"  # no rule yet
        rule = ctl.fail(op="fsync", errno=errno.EIO, path_prefix=str(data), count=1)
        assert step() == "SyncFailedError"
        assert ctl.hits(rule) == 1
        ctl.heal()
        assert step() == "SyncFailedError"  # healed, but that file stays poisoned (fsyncgate)
        assert ctl.hits() == 1
    finally:
        proc.kill()
        proc.wait()


def test_flip_bit(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(struct.pack(">q", 0))
    flip_bit(str(p), 7, 3)
    assert struct.unpack(">q", p.read_bytes())[0] == 8


def _bookie_files(tmp_path, checkpoint: bool):
    """Ten entries of ledger 1 through a real Bookie: in the entry log (checkpoint) or
    only in the journal (a halt without checkpoint)."""
    import asyncio

    from bk.bookie import Bookie
    from bk.config import load_config
    from bk.testing.powerloss import halt_without_checkpoint

    cfg = load_config(env={}, overrides=dict(journal_dirs=[str(tmp_path / "j")], ledger_dirs=[str(tmp_path / "l")],
                                             flush_interval_ms=600_000))
    key = b"k" * 20

    async def main():
        b = Bookie(cfg)
        await b.start()
        for e in range(10):
            await b.add_entry(1, e, struct.pack(">qqq", 1, e, -1) + b"payload-%d" % e, key)
        if checkpoint:
            await b.stop()
        else:
            halt_without_checkpoint(b)
    asyncio.run(main())
    return cfg


def test_corruption_helpers_find_the_entry(tmp_path):
    from bk.testing.corruption import entry_records, journal_records
    from bk.testing.diskfaults import flip_entry_bit, flip_journal_bit, truncate_entry

    cfg = _bookie_files(tmp_path / "a", checkpoint=True)
    (path, offset, size), = entry_records(cfg.ledger_dirs, 1, 4)
    before = open(path, "rb").read()
    assert before[offset + 4:offset + 20] == struct.pack(">qq", 1, 4)
    [(p, at)] = flip_entry_bit(cfg.ledger_dirs, 1, 4, part="ids", bit=40)
    after = open(path, "rb").read()
    assert p == path and struct.unpack(">q", after[offset + 12:offset + 20])[0] == 4 ^ (1 << 40)
    assert sum(a != b for a, b in zip(before, after)) == 1
    assert entry_records(cfg.ledger_dirs, 1, 4) == []  # it now claims another entry
    with pytest.raises(LookupError):
        flip_entry_bit(cfg.ledger_dirs, 1, 4)
    flip_entry_bit(cfg.ledger_dirs, 1, 5, part="payload")
    assert open(path, "rb").read()[offset:offset + 4] == before[offset:offset + 4]
    p, new_size = truncate_entry(cfg.ledger_dirs, 1, 9)
    assert os.path.getsize(p) == new_size

    cfg = _bookie_files(tmp_path / "b", checkpoint=False)
    [(jpath, joff, n)] = journal_records(cfg.journal_dirs, 1, 3)
    [(p, at)] = flip_journal_bit(cfg.journal_dirs, 1, 3)
    assert p == jpath and at == joff + 8 + n - 1
    assert journal_records(cfg.journal_dirs, 1, 3)  # the ids are intact, the CRC is not


def test_flipped_journal_bit_before_the_tail_stops_the_start(tmp_path):
    """A journal record damaged with valid records after it is corruption, not a torn tail:
    the bookie refuses to start rather than skip acknowledged entries."""
    import asyncio

    from bk.bookie import Bookie
    from bk.errors import CorruptedStorageError
    from bk.testing.diskfaults import flip_journal_bit

    cfg = _bookie_files(tmp_path, checkpoint=False)
    flip_journal_bit(cfg.journal_dirs, 1, 3)

    async def start():
        b = Bookie(cfg)
        await b.start()
        await b.stop()
    with pytest.raises(CorruptedStorageError):
        asyncio.run(start())
