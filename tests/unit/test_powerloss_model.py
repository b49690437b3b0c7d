"""The power-loss model itself (bk.testing.powerloss, docs/DISK-FAULTS.md "Power loss"):
what a power cut may undo is undone, what was made durable stays. About 1 s."""
from __future__ import annotations

import errno
import os

import pytest

from bk import fileio
from bk.config import load_config
from bk.errors import StorageError
from bk.index.index import Index
from bk.testing.diskfaults import DiskFaults
from bk.testing.powerloss import install_index_model, simulate_power_loss


@pytest.fixture
def track(tmp_path, monkeypatch):
    path = str(tmp_path / "fsync.track")
    monkeypatch.setenv("BK_FSYNC_TRACK_FILE", path)
    yield path
    DiskFaults.uninstall()


def _cut(track, root):
    return simulate_power_loss(track, [str(root)])


def _synced_file(path, data: bytes = b"") -> None:
    f = fileio.DurableFile(str(path))
    if data:
        f.write(data)
        f.fsync()
    f.close()


def test_a_file_written_and_not_synced_loses_what_was_not_synced(tmp_path, track):
    d = tmp_path / "disk" / "journal"
    fileio.ensure_dir(str(d))
    f = fileio.DurableFile(str(d / "1.txn"))
    f.write(b"a" * 100)
    f.fsync()
    f.write(b"b" * 5000)
    f.close()
    report = _cut(track, tmp_path / "disk")
    assert (d / "1.txn").read_bytes() == b"a" * 100
    assert report.truncated[str(d / "1.txn")] == (5100, 100)


def test_a_file_created_without_a_directory_fsync_is_gone_and_one_with_it_is_emptied(tmp_path, track):
    d = tmp_path / "disk" / "ledgers"
    fileio.ensure_dir(str(d))
    synced_name = d / "named.log"
    synced_name.write_bytes(b"y" * 10)
    fileio.fsync_dir(str(d))  # its name is durable, its bytes never were
    (d / "never-synced.log").write_bytes(b"x" * 10)  # no fsync of it nor of its directory
    _cut(track, tmp_path / "disk")
    assert not (d / "never-synced.log").exists()
    assert synced_name.read_bytes() == b""


def test_a_new_directory_never_fsynced_in_its_parent_is_gone(tmp_path, track):
    root = tmp_path / "disk"
    fileio.ensure_dir(str(root / "current"))
    os.mkdir(root / "current" / "sub")  # not through ensure_dir: its parent is not fsynced after
    (root / "current" / "sub" / "f").write_bytes(b"z")
    _cut(track, root)
    assert (root / "current").is_dir()
    assert not (root / "current" / "sub").exists()


def test_a_rename_not_followed_by_a_directory_fsync_is_undone(tmp_path, track):
    d = tmp_path / "disk" / "current"
    fileio.ensure_dir(str(d))
    fileio.atomic_write(str(d / "VERSION"), b"old cookie")
    faults = DiskFaults.install()
    # the new file's fsync goes on; the directory's fsync after the rename fails
    faults.fail(op="fsync", errno=errno.EIO, path_prefix=str(d), count=1, after=1)
    with pytest.raises(StorageError):
        fileio.atomic_write(str(d / "VERSION"), b"new cookie")
    assert (d / "VERSION").read_bytes() == b"new cookie"  # renamed, but not durably
    report = _cut(track, tmp_path / "disk")
    assert (d / "VERSION").read_bytes() == b"old cookie"
    assert str(d / "VERSION") in report.restored
    assert not (d / "VERSION.tmp").exists()


def test_a_rename_followed_by_a_directory_fsync_stays(tmp_path, track):
    d = tmp_path / "disk" / "current"
    fileio.ensure_dir(str(d))
    fileio.atomic_write(str(d / "VERSION"), b"old cookie")
    fileio.atomic_write(str(d / "VERSION"), b"new cookie")
    _cut(track, tmp_path / "disk")
    assert (d / "VERSION").read_bytes() == b"new cookie"


def test_an_unlink_not_followed_by_a_directory_fsync_is_undone(tmp_path, track):
    d = tmp_path / "disk" / "ledgers"
    fileio.ensure_dir(str(d))
    _synced_file(d / "0.log", b"entries")
    faults = DiskFaults.install()
    faults.fail(op="fsync", errno=errno.EIO, path_prefix=str(d), count=1)
    with pytest.raises(StorageError):
        fileio.remove_file(str(d / "0.log"))
    assert not (d / "0.log").exists()
    _cut(track, tmp_path / "disk")
    assert (d / "0.log").read_bytes() == b"entries"


def test_an_unlink_made_durable_stays(tmp_path, track):
    d = tmp_path / "disk" / "ledgers"
    fileio.ensure_dir(str(d))
    _synced_file(d / "0.log")
    fileio.remove_file(str(d / "0.log"))
    _cut(track, tmp_path / "disk")
    assert not (d / "0.log").exists()


def _index(path, index_sync):
    cfg = load_config(overrides={"index_sync": index_sync, "index_map_size_bytes": 1 << 24}, env={})
    return Index(path, cfg)


@pytest.mark.parametrize("index_sync", [False, True])
def test_an_index_commit_survives_a_cut_only_once_synced(tmp_path, track, index_sync):
    install_index_model()
    root = tmp_path / "disk"
    path = str(root / "current" / "index")
    fileio.ensure_dir(str(root / "current"))
    index = _index(path, index_sync)
    with index.write() as w:
        w.set_flag("synced_one", True)
    index.sync()  # with index_sync = true every commit already is
    with index.write() as w:
        w.set_flag("unsynced_one", True)
    index.close()
    report = _cut(track, root)
    index = _index(path, index_sync)
    try:
        assert index.get_flag("synced_one") is True
        # index_sync = false: a commit without its sync is rolled back; true: LMDB synced it
        assert index.get_flag("unsynced_one") is index_sync
        assert bool(report.index_rolled_back) is (not index_sync)
    finally:
        index.close()


def test_an_in_place_file_keeps_a_synced_write_past_its_preallocated_end(tmp_path, track):
    """Chaos seed 70431 (64 KiB journals, a whole-cluster power cut): a format 2 journal file
    filled to its preallocated end got its FILE_END written past that end and fsynced, then the
    next file was created; the model put back the in-place copy's length and cut the durable
    FILE_END, so three bookies refused to start ("end of the data ... without its end record,
    and later journal files exist"). A fsynced write is durable wherever it lands."""
    d = tmp_path / "disk" / "journal"
    fileio.ensure_dir(str(d))
    f = fileio.DurableFile(str(d / "1.txn"))
    f.write(bytes(4096))  # preallocated zeros, durable
    f.fsync()
    f.size = 0  # written in place from here
    fileio.track_in_place(f.path, 0)
    f.write(b"r" * 4096)  # fills the preallocated space
    f.write(b"E" * 100)  # past its end (the file grows)
    f.fsync()
    f.write(b"u" * 50)  # never synced
    f.close()
    _cut(track, tmp_path / "disk")
    assert (d / "1.txn").read_bytes() == b"r" * 4096 + b"E" * 100
