"""The chaos runs' storage draw (bk/testing/chaos/storage.py): seeded, from its own stream (every
other part of a seed stays as it was), shares as documented, settings a bookie accepts, and two
ledger dirs that every fault touching a bookie's files covers. About 0.5 s."""
from __future__ import annotations

import os

from bk.config import load_config
from bk.testing.chaos import run as chaos_run
from bk.testing.chaos import storage
from bk.testing.chaos.scenario import UNSYNCED_CUT_BREAKS, generate
from bk.testing.cluster import LocalCluster, ledger_dirs_of
from bk.testing.inprocess import InProcessCluster

SEEDS = range(1, 1001)
STORAGE_KEYS = {"ledger_dirs_per_bookie", "gc_wait_time_ms", "minor_compaction_threshold",
                "minor_compaction_interval_s",
                "major_compaction_threshold", "major_compaction_interval_s", "compaction_rate_bytes_per_s",
                "entry_log_size_limit_bytes", "journal_max_size_bytes", "write_cache_max_size_bytes",
                "write_cache_full_wait_ms"}
OFF = storage.StoragePlan(False, 0, 0.0, 0.0, 0, False, 0, 0, False, 0, 0, 1, 0, (0, 0), (0, 0), 1)


def test_the_draw_is_a_function_of_the_seed():
    assert [storage.draw_storage(s) for s in SEEDS] == [storage.draw_storage(s) for s in SEEDS]
    assert len({storage.draw_storage(s) for s in SEEDS}) > 900


def test_the_storage_stream_leaves_every_other_draw_of_a_seed_as_it_was(monkeypatch):
    """The scenario (cluster, workload, faults) never reads the storage stream, and the rest of the
    bookie config is what it is without the draw: the storage settings are the only keys it adds
    (replacing the fixed GC-off and 4 MiB-cache values), whatever the draw."""
    drawn = {s: (generate(s), chaos_run.bookie_config(generate(s))) for s in range(1, 201)}
    monkeypatch.setattr(storage, "draw_storage", lambda seed, draw_for="": OFF)
    for s, (scenario, config) in drawn.items():
        assert generate(s) == scenario
        plain = chaos_run.bookie_config(generate(s))
        assert {k: v for k, v in config.items() if k not in STORAGE_KEYS} == \
               {k: v for k, v in plain.items() if k not in STORAGE_KEYS}
        assert plain["gc_wait_time_ms"] == 3_600_000 and plain["write_cache_max_size_bytes"] == "4MiB"


def test_shares_and_ranges_as_documented():
    plans = [storage.draw_storage(s) for s in SEEDS]
    share = lambda f: sum(map(f, plans)) / len(plans)  # noqa: E731
    assert 0.55 < share(lambda p: p.gc) < 0.65
    assert 0.55 < share(lambda p: p.small_logs) < 0.65
    assert 0.45 < share(lambda p: p.small_cache) < 0.55
    assert 0.45 < share(lambda p: p.ledger_dirs == 2) < 0.55
    for p in plans:
        assert 100 <= p.gc_wait_time_ms <= 500
        assert p.minor_compaction_threshold < p.major_compaction_threshold
        assert 64 * 1024 <= p.entry_log_size_limit_bytes <= 1024 * 1024
        assert 64 * 1024 <= p.journal_max_size_bytes <= 256 * 1024
        assert 64 * 1024 <= p.write_cache_bytes <= 128 * 1024
        assert p.deletes >= 1 or not p.small_cache  # its bursts fill the cache
        assert p.deletes >= 1 if p.gc else p.deletes <= 1  # GC gets dead ledgers to find


def test_every_drawn_config_is_one_a_bookie_accepts(tmp_path):
    """Each plan's settings load (bk.config's checks: 64 KiB write caches, logs and journals)."""
    for seed in range(1, 101):
        config = dict(chaos_run.bookie_config(generate(seed)))
        dirs = config.pop("ledger_dirs_per_bookie", 1)
        cfg = load_config(overrides=dict(config, metadata_service_uri="mem://x/ledgers",
                                         journal_dirs=[str(tmp_path / "j")],
                                         ledger_dirs=ledger_dirs_of(str(tmp_path), dirs)), env={})
        plan = storage.draw_storage(seed)
        if plan.small_cache:
            assert cfg.write_cache_max_size_bytes == plan.write_cache_bytes
        if plan.gc:
            assert cfg.gc_wait_time_ms == plan.gc_wait_time_ms
        assert len(cfg.ledger_dirs) == plan.ledger_dirs


def test_a_break_seen_only_before_the_next_checkpoint_keeps_gc_and_the_cache_as_before():
    for seed in range(1, 200):
        for brk in UNSYNCED_CUT_BREAKS:
            p = storage.draw_storage(seed, brk)
            assert not p.gc and not p.small_cache and p.deletes == 0
            plain = storage.draw_storage(seed)
            assert (p.small_logs, p.ledger_dirs) == (plain.small_logs, plain.ledger_dirs)


def test_two_ledger_dirs_lie_under_the_paths_every_bookie_fault_covers(tmp_path):
    """Both dirs under <bookie>/ledgers: a disk fault on "ledgers" (a path prefix) and a power cut of
    the bookie's directory cover both, and the crash gate closes over both (bookie_dirs)."""
    bookie = str(tmp_path / "bookie-0")
    assert ledger_dirs_of(bookie) == [os.path.join(bookie, "ledgers")]
    two = ledger_dirs_of(bookie, 2)
    assert len(set(two)) == 2 and all(d.startswith(os.path.join(bookie, "ledgers") + os.sep) for d in two)
    cluster = InProcessCluster(tmp_path, bookies=1, ledger_dirs_per_bookie=2)
    assert set(two) <= set(cluster.bookie_dirs(0))
    assert cluster.config(0).resolved_index_dir.startswith(two[0])
    assert LocalCluster(str(tmp_path), ledger_dirs_per_bookie=2).bookie_config(0, 1234)["ledger_dirs"] == two


def _logs_per_dir(dirs) -> list[int]:
    from bk.entrylog.logger import EntryLogger
    from bk.formats.entrylog import log_dir
    el = EntryLogger(dirs, load_config(env={}, overrides={"entry_log_size_limit_bytes": 64 * 1024}))
    for i in range(40):  # 40 entries of 8 KiB: a rotation every 7 or so
        el.add_entries([(7).to_bytes(8, "big") + i.to_bytes(8, "big") + bytes(8192)])
    el.close()
    return [len([n for n in os.listdir(log_dir(d)) if n.endswith(".log")]) for d in dirs]


def test_two_dirs_on_one_filesystem_each_get_entry_logs_as_two_disks_would(tmp_path, monkeypatch):
    """Both chaos ledger dirs lie on one filesystem: plain, every log lands in the first (same free
    space, the first wins); with SeparateDisks (installed by an in-process run with two dirs)
    each dir counts what its logs hold, and new logs alternate."""
    from bk.entrylog import logger
    # the filesystem's free space is one snapshot: tests writing and deleting beside this one
    # (parallel workers) changed it between two dirs' lookups, so another dir sometimes looked
    # emptier than the logs alone make it
    snapshot = logger.disk_space(str(tmp_path))
    monkeypatch.setattr(logger, "_dir_space", lambda path: snapshot)
    plain = _logs_per_dir([str(tmp_path / "a" / "0"), str(tmp_path / "a" / "1")])
    assert plain[0] > 1 and plain[1] == 0
    before = logger._dir_space
    storage.SeparateDisks.install()
    try:
        separate = _logs_per_dir([str(tmp_path / "b" / "0"), str(tmp_path / "b" / "1")])
    finally:
        storage.SeparateDisks.uninstall()
    assert min(separate) >= 2 and abs(separate[0] - separate[1]) <= 1
    assert logger._dir_space is before  # uninstalled
