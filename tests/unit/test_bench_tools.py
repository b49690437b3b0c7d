"""The benchmark tools' logic: argument parsing, percentile math, aggregation, tables,
RESP encoding/parsing, the raw-disk grouping and the Redis-missing path.

No throughput is asserted anywhere (benchmarks measure speed; tests check logic).
The few tests that start redis-server or write a file are tiny and bounded.
"""
from __future__ import annotations

import asyncio
import os
import pathlib
import shutil
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from bench import compare, load, rawdisk, redisbench, stats  # noqa: E402
from bench.diskstats import BlockDevice  # noqa: E402
from bench.procmem import RssSampler, read_cpu_s, read_status_kib  # noqa: E402


# ---------------------------------------------------------------- stats
def test_latency_summary_percentiles_in_ms():
    lat_s = np.arange(1, 1001) / 1000.0  # 1 ms .. 1000 ms
    s = stats.latency_summary_ms(lat_s)
    assert s["samples"] == 1000
    assert s["p50"] == pytest.approx(500.5)
    assert s["p99"] == pytest.approx(990.01)
    assert s["p999"] == pytest.approx(999.001)
    assert s["max"] == pytest.approx(1000.0) and s["mean"] == pytest.approx(500.5)


def test_latency_summary_of_nothing_is_none_not_zero():
    s = stats.latency_summary_ms([])
    assert s["samples"] == 0 and s["p99"] is None and s["max"] is None


def test_sizes_parse_with_units_and_reject_bad_input():
    assert stats.size_list("100,1024,64KiB") == [100, 1024, 65536]
    assert stats.parse_size("1k") == 1024 and stats.parse_size("2MiB") == 2 << 20
    for bad in ("", "abc", "0", "1,-5", "1.5k"):
        with pytest.raises(Exception):
            stats.size_list(bad)


def test_median_spread_and_ratio():
    assert stats.median_or_none([3, None, 1, 2]) == 2
    assert stats.median_or_none([None]) is None
    assert stats.spread_pct([90, 100, 110]) == pytest.approx(10.0)
    assert stats.spread_pct([5]) is None
    assert stats.ratio(50, 100) == 0.5 and stats.ratio(1, 0) is None and stats.ratio(None, 2) is None
    assert stats.rate(10, 0) == 0.0


def test_render_table_aligns_columns():
    text = stats.render_table(["name", "n"], [["a", "1"], ["long-name", "12345"], ["short"]])
    lines = text.splitlines()
    assert lines[0].startswith("name") and lines[1].startswith("---------")
    assert lines[2] == "a              1" and lines[3] == "long-name  12345"
    assert lines[4] == "short"  # padded row, trailing blanks stripped
    with pytest.raises(ValueError):
        stats.render_table(["a"], [["1", "2"]])


def test_human_size_is_exact():
    assert stats.human_size(65536) == "64KiB" and stats.human_size(1000) == "1000B"
    assert stats.human_size(100) == "100B" and stats.human_size(1 << 20) == "1MiB"


# ---------------------------------------------------------------- load generator
def test_load_defaults_to_ten_seconds_on_an_own_cluster():
    spec, args = load.parse_args([])
    assert spec.duration_s == 10.0 and spec.count is None and spec.entry_size == 1024
    assert spec.in_flight == 1000 and (spec.ensemble, spec.write_quorum, spec.ack_quorum) == (1, 1, 1)
    assert args.metadata_uri is None and args.bookies == 1 and args.settings == {} and args.writers == 1


def test_load_count_mode_and_own_cluster_settings():
    spec, args = load.parse_args(["--count", "5000", "--entry-size", "64KiB", "--bookies", "3", "--ensemble", "3",
                                  "--write-quorum", "2", "--ack-quorum", "2", "--no-journal",
                                  "--bookie-set", "flush_interval_ms=500", "--bookie-set", "journal_dirs=['/x']"])
    assert spec.count == 5000 and spec.duration_s is None and spec.entry_size == 65536
    assert args.settings == {"journal_write_data": False, "flush_interval_ms": 500, "journal_dirs": ["/x"]}


@pytest.mark.parametrize("argv", [
    ["--count", "10", "--duration-s", "5"],  # both
    ["--ack-quorum", "2"],  # AQ > WQ
    ["--ensemble", "3", "--write-quorum", "3"],  # E > bookies of the own cluster
    ["--metadata-uri", "zk://x/ledgers", "--no-journal"],  # own-cluster option on a given cluster
    ["--in-flight", "0"], ["--duration-s", "-1"], ["--entry-size", "0"],
    ["--count", "1", "--writers", "2"], ["--bookie-set", "novalue"],
])
def test_load_rejects_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as e:
        load.parse_args(argv)
    assert e.value.code == 2 and "error" in capsys.readouterr().err


def test_load_spec_validation():
    assert load.LoadSpec().duration_s == load.DEFAULT_DURATION_S
    assert load.LoadSpec(count=5).duration_s is None
    with pytest.raises(ValueError, match="not both"):
        load.LoadSpec(duration_s=1.0, count=5)
    with pytest.raises(ValueError, match="write quorum"):
        load.LoadSpec(ensemble=2, write_quorum=3, ack_quorum=1)


def test_split_count_covers_the_total():
    assert load.split_count(10, 3) == [4, 3, 3]
    assert sum(load.split_count(1_000_003, 7)) == 1_000_003


def _raw(t_start, t_end, lat_ms, errors=0):
    return {"t_start": t_start, "t_end": t_end, "cpu_s": 1.0, "entries": len(lat_ms), "errors": errors, "error": None,
            "phases_s": {"adds": t_end - t_start},
            "latency_s": np.asarray(lat_ms) / 1000.0, "reads": None, "ledger_ids": [t_start]}


def test_summarize_aggregates_writers_over_the_common_window():
    spec = load.LoadSpec(duration_s=1.0, entry_size=1000)
    s = load.summarize([_raw(10.0, 12.0, [1.0] * 300), _raw(11.0, 14.0, [3.0] * 100, errors=2)], spec, 2)
    a = s["adds"]
    assert a["entries"] == 400 and a["elapsed_s"] == pytest.approx(4.0)  # 10.0 .. 14.0
    assert a["entries_per_s"] == pytest.approx(100.0) and a["mb_per_s"] == pytest.approx(0.1)
    assert a["latency_ms"]["p50"] == pytest.approx(1.0) and a["latency_ms"]["max"] == pytest.approx(3.0)
    assert a["errors"] == 2 and s["ledger_ids"] == [10.0, 11.0] and s["reads"] is None
    assert a["client_cpu_pct"] == pytest.approx(50.0)  # 2 CPU s over a 4 s window
    text = load.format_summary(s)
    assert "100 entries/s" in text and "errors 2" in text


class _InstantLedger:
    """A ledger handle whose adds are acknowledged before async_add_entry returns."""

    def __init__(self, ledger_id):
        self.ledger_id, self.next_entry_id = ledger_id, 0

    @property
    def last_add_pushed(self):
        return self.next_entry_id - 1

    def async_add_entry(self, data, callback=None):
        entry_id = self.next_entry_id
        self.next_entry_id += 1
        if callback is not None:  # queued, like a completion the real handle delivers later
            asyncio.get_running_loop().call_soon(callback, entry_id, None)
            return entry_id
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(entry_id)
        return fut

    async def add_entry(self, data):
        return await self.async_add_entry(data)

    async def close(self):
        pass


class _FakeBookKeeper:
    def __init__(self, uri):
        self.ledgers = 0

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        pass

    async def create_ledger(self, *args, **kwargs):
        self.ledgers += 1
        return _InstantLedger(self.ledgers)


@pytest.mark.timeout(30)  # a hang detector: the old drain slept DRAIN_TIMEOUT_S (60 s) here
def test_writer_drain_wakes_for_completions_already_queued(monkeypatch):
    """Completion callbacks queued before the drain starts must end it (no lost wake-up)."""
    import bk.client
    monkeypatch.setattr(bk.client, "BookKeeper", _FakeBookKeeper)
    marks = []
    spec = load.LoadSpec(count=1000, in_flight=64, ledgers=3, entry_size=10)
    raw = asyncio.run(load.run_writer("mem://x/ledgers", spec, on_mark=marks.append))
    assert raw["entries"] == 1000 and raw["errors"] == 0 and raw["latency_s"].size == 1000
    assert (raw["latency_s"] >= 0).all() and raw["ledger_ids"] == [1, 2, 3]
    assert marks == ["adds_start", "adds_end"]
    s = load.summarize([raw], spec, 1)
    assert s["adds"]["bytes"] == 10_000 and set(s["phases_s"]) >= {"connect", "adds", "close_client"}


@pytest.mark.timeout(30)
def test_paced_writer_issues_on_schedule_and_never_runs_ahead(monkeypatch):
    import bk.client
    monkeypatch.setattr(bk.client, "BookKeeper", _FakeBookKeeper)
    spec = load.LoadSpec(count=200, in_flight=64, entry_size=10, rate=2000.0)  # 200 adds due over 0.1 s
    raw = asyncio.run(load.run_writer("mem://x/ledgers", spec))
    assert raw["entries"] == 200 and raw["errors"] == 0
    # the last add is due at 199/2000 s: a paced writer cannot finish earlier
    assert raw["t_end"] - raw["t_start"] >= 199 / 2000
    # the service latency of each add (from when it left) is its latency from when it
    # was due less the generator's lag, so never more, and never negative
    svc, lat = raw["service_s"], raw["latency_s"]
    assert svc.size == lat.size == 200 and (svc >= 0).all() and (svc <= lat + 1e-12).all()
    with pytest.raises(ValueError, match="rate"):
        load.LoadSpec(count=1, rate=0)
    text = load.format_summary(load.summarize([raw], spec, 1))
    assert "paced at 2,000 adds/s" in text and "from when each add left to its ack" in text


def test_format_summary_shows_missing_latency_as_dash():
    spec = load.LoadSpec(count=5)
    s = load.summarize([_raw(1.0, 1.0, [])], spec, 1)
    assert "p99 -" in load.format_summary(s)


# ---------------------------------------------------------------- raw disk
def test_group_bytes_follows_depth_and_cap_in_whole_entries():
    assert rawdisk.group_bytes(100, 1000) == 100_000
    assert rawdisk.group_bytes(1024, 1000) == 512 * 1024
    assert rawdisk.group_bytes(65536, 1000) == 512 * 1024
    assert rawdisk.group_bytes(1000, 1000) == 524 * 1000  # whole entries under the cap
    assert rawdisk.group_bytes(1 << 20, 4) == 1 << 20  # one entry larger than the cap
    with pytest.raises(ValueError):
        rawdisk.group_bytes(0, 10)


@pytest.mark.parametrize("drop_pages", [True, False])
def test_raw_disk_run_counts_bytes_and_removes_its_file(tmp_path, drop_pages):
    r = rawdisk.run_raw_disk(4096, 8, 0.05, str(tmp_path), drop_pages=drop_pages)
    assert r["drop_pages"] is drop_pages
    assert r["group_bytes"] == 32768 and r["groups"] >= 1
    assert r["bytes"] == r["groups"] * 32768 and r["entries"] == r["bytes"] // 4096
    assert r["latency_ms"]["samples"] == r["groups"]
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- Redis
def test_resp_encoding():
    assert redisbench.encode_command("SET", b"k", 12) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n12\r\n"
    assert redisbench.encode_command(b"") == b"*1\r\n$0\r\n\r\n"


def test_resp_parser_handles_split_replies_and_every_type():
    stream = b"+OK\r\n$15\r\n1700000000000-0\r\n:42\r\n$-1\r\n*2\r\n$1\r\na\r\n:7\r\n-ERR wrong type\r\n$0\r\n\r\n"
    whole = redisbench.RespParser().feed(stream)
    assert whole[:5] == [b"OK", b"1700000000000-0", 42, None, [b"a", 7]]
    assert isinstance(whole[5], redisbench.RespError) and "wrong type" in str(whole[5])
    assert whole[6] == b""
    p, got = redisbench.RespParser(), []
    for i in range(len(stream)):  # one byte at a time: no reply lost, none invented
        got.extend(p.feed(stream[i:i + 1]))
    assert [g if not isinstance(g, redisbench.RespError) else "E" for g in got] == \
        [w if not isinstance(w, redisbench.RespError) else "E" for w in whole]


def test_resp_parser_rejects_garbage():
    with pytest.raises(redisbench.RespError):
        redisbench.RespParser().feed(b"?what\r\n")


def test_split_depth():
    assert redisbench.split_depth(1000, 3) == [334, 333, 333]
    with pytest.raises(ValueError):
        redisbench.split_depth(2, 3)


def test_redis_benchmark_requests_are_whole_pipelines():
    assert redisbench.whole_batches(611_234, 1000, 1) == 612_000
    assert redisbench.whole_batches(6000, 500, 2) == 6000
    assert redisbench.whole_batches(10, 1000, 1) == 1000


def test_parse_redis_benchmark_csv():
    text = ('"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms",'
            '"max_latency_ms"\n"SET","75859.48","10.5","1.2","9.9","12.0","13.4","20.1"\n')
    r = redisbench.parse_redis_benchmark_csv(text)
    assert r["test"] == "SET" and r["rps"] == pytest.approx(75859.48) and r["p99_latency_ms"] == pytest.approx(13.4)
    with pytest.raises(ValueError):
        redisbench.parse_redis_benchmark_csv("")


def test_redis_missing_says_how_to_install(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(redisbench.RedisMissingError, match="apt-get install redis-server"):
        redisbench.RedisServer()
    with pytest.raises(redisbench.RedisMissingError, match="redis-tools"):
        redisbench.run_redis_benchmark(1, 100, 10, 100)


def test_compare_skips_redis_with_the_install_message(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    args = compare.parse_args(["--systems", "redis-resp,redis-benchmark", "--runs", "1", "--out-dir", str(tmp_path)])
    logged = []
    result = compare.run_compare(args, logged.append)
    assert result["measurements"] == [] and result["config"]["systems"] == []
    assert any("apt-get install redis-server" in m for m in logged)
    assert any("apt-get install redis-server" in n for n in result["notes"])


def test_compare_records_a_failed_measurement_and_goes_on(monkeypatch, tmp_path):
    calls = []

    def flaky(size, args, run):
        calls.append(size)
        if size == 100:
            raise OSError("disk went away")
        return compare._measurement("raw-disk", size, run, {"entries": 10, "bytes": 10 * size, "elapsed_s": 1.0,
                                                            "entries_per_s": 10.0, "mb_per_s": 0.0,
                                                            "latency_ms": {"p99": 1.0}}, {}, {})

    monkeypatch.setattr(compare, "measure_raw", flaky)
    args = compare.parse_args(["--systems", "raw-disk", "--runs", "1", "--sizes", "100,200"])
    result = compare.run_compare(args, lambda msg: None)
    assert calls == [100, 200]
    assert result["failures"] == [{"system": "raw-disk", "entry_size": 100, "run": 0,
                                   "error": "OSError: disk went away", "phase": "peak"}]
    assert [(r["system"], r["entry_size"]) for r in result["summary"]] == [("raw-disk", 200)]


def test_compare_half_peak_paces_each_bk_system_at_half_its_median_peak(monkeypatch, tmp_path):
    """--half-peak: after the peak runs, every bk system runs again paced at half its
    median peak, with a window wide enough not to throttle; the latency summary takes
    the medians from when each add was due and from when it left."""
    import bk.testing.zookeeper as zk_mod

    class FakeZK:
        connect_string, data_dir = "127.0.0.1:1", str(tmp_path / "zk")

        def __init__(self, d):
            pass

        def start(self):
            return self

        def stop(self):
            pass
    monkeypatch.setattr(zk_mod, "LocalZooKeeper", FakeZK)
    calls = []
    peaks = iter([1000.0, 3000.0, 2000.0])  # peak runs of bk-1: median 2000

    def fake_bk(system, size, args, run, zk_connect, rate=None):
        calls.append((system, size, run, rate))
        lat = {"p50": 1.0, "p99": 4.0 + run} if rate else {"p50": 5.0, "p99": 9.0}
        r = {"entries": 10, "bytes": 10 * size, "elapsed_s": 1.0, "entries_per_s": rate or next(peaks),
             "mb_per_s": 0.0, "latency_ms": lat}
        if rate:
            r["service_latency_ms"] = {"p50": 0.5, "p99": 3.0 + run}
        return compare._measurement(system, size, run, r, {}, {})
    monkeypatch.setattr(compare, "measure_bk", fake_bk)
    args = compare.parse_args(["--systems", "bk-1", "--runs", "3", "--sizes", "100", "--half-peak"])
    result = compare.run_compare(args, lambda msg: None)
    assert [c[3] for c in calls] == [None, None, None, 1000.0, 1000.0, 1000.0]
    (row,) = result["half_peak_summary"]
    assert (row["system"], row["rate"], row["p99_ms"], row["sent_p99_ms"]) == ("bk-1", 1000.0, 5.0, 4.0)
    assert row["p99_ms_runs"] == [4.0, 5.0, 6.0]
    assert "sent p99" in compare.render_half_peak(result["half_peak_summary"])
    # without the flag nothing is paced
    calls.clear()
    peaks = iter([1000.0])
    compare.run_compare(compare.parse_args(["--systems", "bk-1", "--runs", "1", "--sizes", "100"]), lambda m: None)
    assert [c[3] for c in calls] == [None]


@pytest.mark.skipif(not shutil.which("redis-server"), reason="redis-server not installed")
def test_resp_client_against_a_real_redis_counts_every_reply():
    with redisbench.RedisServer() as server:
        data_dir = server.dir
        r = redisbench.run_resp_load(server.port, 100, 16, count=300, connections=2)
        assert r["entries"] == 300 and r["errors"] == 0 and r["latency_ms"]["samples"] == 300
    assert not os.path.exists(data_dir)  # stopped and cleaned up


# ---------------------------------------------------------------- compare
def test_compare_arguments():
    args = compare.parse_args([])
    assert args.sizes == [100, 1024, 65536] and args.runs == 3 and args.in_flight == 1000
    assert args.systems == list(compare.SYSTEMS)
    args = compare.parse_args(["--systems", "bk-3,raw-disk,bk-3", "--sizes", "1KiB"])
    assert args.systems == ["raw-disk", "bk-3"] and args.sizes == [1024]
    for bad in (["--systems", "mysql"], ["--runs", "0"], ["--in-flight", "2", "--redis-connections", "3"]):
        with pytest.raises(SystemExit):
            compare.parse_args(bad)


def _m(system, size, run, eps, p99, rss=None, cpu=None, disk=None):
    return {"system": system, "entry_size": size, "run": run, "entries_per_s": eps, "mb_per_s": eps * size / 1e6,
            "latency_ms": {"p99": p99}, "peak_rss_mib": rss or {}, "server_cpu_pct": cpu or {},
            "client_cpu_pct": 90.0 + run, "errors": 0, "disk_mb_per_s": disk}


def test_compare_summary_medians_and_ratios():
    ms = [_m("raw-disk", 100, r, v, 1.0) for r, v in enumerate((1000, 2000, 3000))]
    ms += [_m("redis-resp", 100, r, v, 5.0, {"redis-server": 10}) for r, v in enumerate((400, 500, 600))]
    ms += [_m("bk-3", 100, r, v, p, {"bookie-0": 50, "bookie-1": 80 + r, "bookie-2": None},
              {"bookie-0": 10.0 * r, "bookie-1": 20.0, "bookie-2": None}, disk=[3.0, 1.0, 2.0][r])
           for r, (v, p) in enumerate(((900, 9.0), (1000, 7.0), (1100, 8.0)))]
    rows = compare.summarize(ms, ["raw-disk", "redis-resp", "bk-3"], [100])
    bk = next(r for r in rows if r["system"] == "bk-3")
    assert bk["entries_per_s"] == 1000 and bk["p99_ms"] == 8.0 and bk["runs"] == 3
    assert bk["x_raw"] == pytest.approx(0.5) and bk["x_redis"] == pytest.approx(2.0)
    assert bk["x_redis_benchmark"] is None  # not measured
    assert bk["peak_rss_mib"] == 81 and bk["peak_rss_mib_max"] == 82  # largest bookie per run, median of runs
    assert bk["spread_pct"] == pytest.approx(10.0)
    assert bk["server_cpu_pct"] == 30.0 and bk["client_cpu_pct"] == 91.0  # bookies summed per run, then median
    assert bk["disk_mb_per_s"] == 2.0  # the device's rate, median of runs
    raw = next(r for r in rows if r["system"] == "raw-disk")
    assert raw["server_cpu_pct"] is None and "x_raw" not in raw
    assert raw["disk_mb_per_s"] == pytest.approx(0.2)  # raw-disk's payload is what its disk wrote
    table = compare.render_summary(rows)
    assert "bk-3" in table and "0.50" in table and "2.00" in table


def test_chart_degrades_without_matplotlib(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    rows = compare.summarize([_m("raw-disk", 100, 0, 10.0, 1.0)], ["raw-disk"], [100])
    assert compare.write_chart(rows, str(tmp_path / "c.png")) is None
    assert not (tmp_path / "c.png").exists()


def test_chart_is_a_png_when_matplotlib_is_installed(tmp_path):
    pytest.importorskip("matplotlib")  # scripts/setup installs it (the bench extra)
    ms = [_m("raw-disk", 100, 0, 10.0, 1.0), _m("bk-1", 100, 0, 5.0, 2.0)]
    rows = compare.summarize(ms, ["raw-disk", "bk-1"], [100])
    path = compare.write_chart(rows, str(tmp_path / "c.png"))
    assert path is not None and (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- memory sampling
def test_rss_and_cpu_of_this_process_and_of_a_missing_pid():
    assert read_status_kib(os.getpid())["VmRSS"] > 0
    assert read_cpu_s(os.getpid()) > 0
    with RssSampler({"me": os.getpid(), "gone": 2 ** 22 + 12345}, interval_s=0.01) as rss:
        sum(i * i for i in range(200_000))  # some CPU for the sampler to see
    peak, cpu = rss.peak_mib(), rss.cpu_pct()
    assert peak["me"] > 1 and peak["gone"] is None
    assert cpu["me"] is not None and cpu["me"] >= 0 and cpu["gone"] is None


# ---------------------------------------------------------------- disk throughput
def test_block_device_counts_what_a_synced_write_puts_on_the_disk(tmp_path):
    dev = BlockDevice.of(str(tmp_path))
    if dev is None:
        pytest.skip("the test directory is not on a block device in /proc/diskstats (tmpfs?)")
    before = dev.written_bytes()
    with open(tmp_path / "f", "wb") as fh:
        fh.write(os.urandom(4 << 20))
        fh.flush()
        os.fsync(fh.fileno())
    # other processes may write too: at least our 4 MiB reached the device
    assert dev.written_bytes() - before >= 4 << 20


def test_block_device_of_a_path_that_is_no_device():
    assert BlockDevice.of("/proc") is None
    assert BlockDevice("no-such-disk").written_bytes() is None


def test_sampler_reports_disk_rate_between_marks(tmp_path):
    class FakeDisk:
        name, value = "fake", 0

        def written_bytes(self):
            return self.value
    disk = FakeDisk()
    rss = RssSampler({}, disk=disk)
    rss.mark("a")
    disk.value = 10_000_000
    time.sleep(0.01)
    rss.mark("b")
    rate = rss.disk_mb_per_s(("a", "b"))
    assert 0 < rate <= 10 / 0.01
    assert rss.disk_mb_per_s(("a", "missing")) is None
    assert RssSampler({}).disk_mb_per_s(("a", "b")) is None


@pytest.mark.timeout(60)
def test_echo_floor_echoes_every_message_and_counts_from_due_no_earlier_than_from_sent(tmp_path):
    from bench import echo
    s = echo.run(rate=2000.0, size=100, duration_s=0.3)
    assert s["sent"] >= 500 and s["echoed"] == s["sent"]  # 0.3 s at 2000/s: ~600 due
    lat, due = s["latency_ms"], s["from_due_ms"]
    assert lat["samples"] == due["samples"] == s["echoed"]
    assert 0 <= lat["p50"] <= due["p50"] and lat["max"] <= due["max"]
    assert "of " + str(s["sent"]) in echo.format_summary(s)
    with pytest.raises(SystemExit):
        echo.main(["--entry-size", "0"])
