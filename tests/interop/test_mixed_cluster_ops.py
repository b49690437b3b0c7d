"""Operating a mixed cluster (docs/INTEROP.md): three bk bookies and three Apache BookKeeper
4.17.4 bookies on one metadata root, the way an operator replacing Java bookies one at a time
runs it. One cluster serves the module; the tests run in file order and each leaves the cluster
with no ledgers of its own.

- GC: ledgers the Java client wrote over both kinds, some deleted by the Java client; a forced
  GC pass (HTTP PUT /api/v1/bookie/gc, compaction thresholds at 1.0) on every bk bookie deletes
  exactly the deleted ones (gone from the index, their bytes reclaimed) and compacts around the
  live one, which the Java client then reads back in full.
- BP-46: a journal-off bk bookie is SIGKILLed before any checkpoint; its bk-written ledgers have
  only Java peers, and a Java-written ledger spans every bookie. On restart it puts them in
  limbo, recovers the open one and copies what it lost back from its peers; then every entry it
  should hold reads back from it.
- AutoRecovery, twice: one bk and one Java bookie killed for good; every ledger (bk- and
  Java-written) is re-replicated to full, with ensembles laid out so that a lost bk bookie's
  share can only go to a Java bookie and a lost Java bookie's to a bk bookie. First by bk's
  auditor and workers (`bk autorecovery` beside each surviving bookie, Java ones included: bk's
  worker copies to the bookie it runs beside), then by Java's own AutoRecovery (AutoRecoveryMain
  beside a Java bookie, elected auditor; a `bk autorecovery` votes after it). Every entry is
  then read from every replica the new metadata names, bytes checked.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from interop_support import (  # noqa: E402
    DEFAULT_RELEASE, JAVA_BK, PASSWORD, JavaBookie, die_with_parent, format_root, fresh_root, java_client, java_payload, require_java_bk, run_async,
    wait_registered,
)

from bk.client import BookKeeper  # noqa: E402
from bk.entrylog.usage import list_entry_logs, read_log_metadata  # noqa: E402
from bk.meta.ledger_metadata import LedgerState  # noqa: E402
from bk.meta.underreplication import LedgerUnderreplicationManager  # noqa: E402
from bk.proto import DigestManager, DigestType, StatusCode  # noqa: E402
from bk.replication.election import current_auditor  # noqa: E402
from bk.testing.cluster import LocalCluster, write_toml  # noqa: E402

RELEASE = DEFAULT_RELEASE
SIZE = 512
WAIT_S = 120.0  # bound on something that must happen (never a timing assertion)
ZK_TIMEOUT_MS = 4000  # a killed bookie's registration goes away this long after the kill
# bk's AutoRecovery settings, shared by the bk bookies and every `bk autorecovery` process
BK_AUTORECOVERY = dict(lost_bookie_recovery_delay_s=0, auditor_periodic_check_interval_s=0,
                       auditor_periodic_bookie_check_interval_s=3600, open_ledger_rereplication_grace_period_ms=3000)
# the same for Java's AutoRecovery (ServerConfiguration names)
JAVA_AUTORECOVERY = dict(lostBookieRecoveryDelay=0, auditorPeriodicCheckInterval=0,
                         auditorPeriodicPlacementPolicyCheckInterval=0, auditorPeriodicReplicasCheckInterval=0,
                         openLedgerRereplicationGracePeriod=3000)


class Mixed:
    """The module's cluster: bk bookies (LocalCluster) and Java bookies, which are alive."""

    def __init__(self, cluster: LocalCluster, uri: str, base):
        self.cluster = cluster
        self.java: list[JavaBookie] = []
        self.base = base
        self.uri = uri

    def bk_alive(self) -> list:
        return [b for b in self.cluster.bookies.values() if b.alive]

    def java_alive(self) -> list[JavaBookie]:
        return [b for b in self.java if b.alive]

    def add_java(self, **conf) -> JavaBookie:
        b = JavaBookie(self.uri, self.base / f"java-{len(self.java)}", RELEASE,
                       conf={"zkTimeout": ZK_TIMEOUT_MS, **conf}).start()
        self.java.append(b)
        return b

    def stop(self) -> None:
        for b in self.java:
            b.stop()
        self.cluster.stop()


@pytest.fixture(scope="module")
def mixed(interop_zk, tmp_path_factory):
    base = tmp_path_factory.mktemp("mixed-ops")
    root = fresh_root(interop_zk, "mixed-ops")
    cluster = LocalCluster(str(base / "bk"), 3, zk_connect=root,
                           zk_timeout_ms=ZK_TIMEOUT_MS, flush_interval_ms=200, entry_log_size_limit_bytes="64KiB",
                           gc_wait_time_ms=3_600_000, major_compaction_threshold=1.0, minor_compaction_threshold=1.0,
                           http_server_mutations_enabled=True, **BK_AUTORECOVERY)
    require_java_bk(RELEASE)
    m = Mixed(cluster, f"zk://{root}/ledgers", base)  # the URI cluster.start() takes
    try:
        format_root(m.uri)
        for _ in range(3):  # the JVMs boot while the bk bookies start
            m.add_java()
        cluster.start()
        assert cluster.metadata_uri == m.uri
        wait_registered(m.uri, m.bk_alive() + m.java)
        yield m
    finally:
        m.stop()


# ---------------------------------------------------------------------- helpers
async def create_on(bkc, ensemble: list[str], e: int, wq: int, aq: int):
    """A ledger of bk's client on exactly `ensemble` (in that order)."""
    bkc.placement.new_ensemble = lambda size, writable, exclude=(), **_: list(ensemble)
    try:
        return await bkc.create_ledger(e, wq, aq, digest_type="CRC32C", password=PASSWORD)
    finally:
        del bkc.placement.new_ensemble


async def write_on(bkc, ensemble: list[str], n: int, *, wq: int = 3, aq: int = 2, close: bool = True):
    lh = await create_on(bkc, ensemble, len(ensemble), wq, aq)
    await lh.add_entries([java_payload(i, SIZE) for i in range(n)])
    if close:
        await lh.close()
    return lh


async def replicas_hold(bkc, ledger_id: int, n: int, *, only: str | None = None) -> int:
    """Every entry 0..n-1 read from every bookie of its write set (or from `only`, where the write
    set names it), digest verified and compared with the Driver's payload; returns the reads."""
    md = await bkc.get_ledger_metadata(ledger_id)
    digest = DigestManager(ledger_id, DigestType(int(md.digest_type)), md.password)
    wanted = []
    for entry_id in range(n):
        ensemble = md.ensemble_for(entry_id)
        for k in range(md.write_quorum_size):
            bookie = ensemble[(entry_id + k) % md.ensemble_size]
            if only is None or bookie == only:
                wanted.append((entry_id, bookie))

    async def one(entry_id: int, bookie: str):
        client = bkc.pool.get(bookie)
        response = await client.call(client.send_read, ledger_id, entry_id)
        assert response.rc == int(StatusCode.EOK), \
            f"ledger {ledger_id} entry {entry_id} on {bookie}: rc {response.rc}"
        _, _, got = digest.verify_entry(entry_id, response.body)
        assert bytes(got) == java_payload(entry_id, SIZE), f"ledger {ledger_id} entry {entry_id} on {bookie} differs"

    for i in range(0, len(wanted), 200):
        await asyncio.gather(*(one(e, b) for e, b in wanted[i:i + 200]))
    return len(wanted)


async def until(predicate, what: str, wait_s: float = WAIT_S, poll_s: float = 0.2):
    deadline = time.monotonic() + wait_s
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {wait_s:.0f} s waiting for {what}")
        await asyncio.sleep(poll_s)


async def delete_all(uri: str) -> None:
    """A test leaves no ledger behind: the next one's AutoRecovery audits only its own."""
    async with BookKeeper(uri) as bkc:
        for lid in await bkc.list_ledgers():
            await bkc.delete_ledger(lid)


def http(bookie, method: str, path: str, body: dict | None = None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(bookie.http_url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def java_bench(uri: str, *args: str, n: int = 600) -> dict:
    return java_client("bench", uri, "-n", str(n), "-s", str(SIZE), "-k", "100", *args, release=RELEASE)


# ---------------------------------------------------------------------- GC
def ledger_dir(b) -> str:
    return os.path.join(os.path.dirname(b.conf_path), f"bookie-{b.index}", "ledgers")


def held_in_logs(b, ledgers: set[int]) -> tuple[int, int]:
    """Bytes `ledgers` take in bookie b's entry logs: (all logs, the newest one: the log being
    written, which GC never touches)."""
    per = [sum(n for lid, n in read_log_metadata(p).ledgers.items() if lid in ledgers)
           for _, p in list_entry_logs(ledger_dir(b))]
    return sum(per), per[-1]


def log_bytes(b) -> int:
    return sum(os.path.getsize(p) for _, p in list_entry_logs(ledger_dir(b)))


def forced_gc(b) -> dict:
    """BookKeeper's way: PUT /api/v1/bookie/gc, poll GET until the pass ended, its figures."""
    passes = http(b, "GET", "/api/v1/bookie/gc_details")[0]["passes"]
    assert http(b, "PUT", "/api/v1/bookie/gc", {"forceMajor": True, "forceMinor": True}).startswith("Triggered GC")
    deadline = time.monotonic() + WAIT_S
    while True:
        st = http(b, "GET", "/api/v1/bookie/gc_details")[0]
        if st["passes"] > passes and http(b, "GET", "/api/v1/bookie/gc")["is_in_force_gc"] == "false":
            return st["last_pass"]
        assert time.monotonic() < deadline, f"no GC pass ended on {b.bookie_id}: {st}"
        time.sleep(0.1)


def test_bk_gc_keeps_what_java_written_ledgers_hold(mixed):
    uri = mixed.uri
    # three Java-written ledgers over all six bookies, one after the other: the first and the last
    # deleted by the Java client itself, so entry logs on bk bookies mix dead and live Java data
    layout = ("-e", "6", "-w", "3", "-a", "2")
    dead = [java_bench(uri, *layout, "--delete")["ledger_id"]]
    live = java_bench(uri, *layout)
    dead.append(java_bench(uri, *layout, "--delete")["ledger_id"])
    assert set(live["ensemble_bookies"].strip("[]").replace(" ", "").split(",")) >= set(mixed.cluster.bookie_ids)
    live_id = live["ledger_id"]
    n = live["entries"]
    time.sleep(1.0)  # a checkpoint or two (flush_interval_ms=200): the entries reach the entry logs

    reclaimed = {}
    for b in mixed.bk_alive():
        held, in_current = held_in_logs(b, set(dead))
        assert held > 0  # the deleted ledgers did have bytes here (the check below can fail)
        before = log_bytes(b)
        out = forced_gc(b)
        assert out["ok"] and out["ledgers_deleted"] == len(dead), out  # the pass's figures are counts
        assert out["logs_compacted"] or out["logs_deleted"], out
        after = log_bytes(b)
        # what the deleted ledgers held is gone, but in the log being written
        assert before - after >= held - in_current, (before, after, held, in_current, out)
        assert held_in_logs(b, set(dead))[0] <= in_current
        reclaimed[b.bookie_id] = (before - after, out["logs_compacted"])
    assert any(compacted for _, compacted in reclaimed.values()), reclaimed  # compaction moved live Java data
    print("bytes reclaimed, logs compacted per bk bookie:", reclaimed)

    async def check_bk_side():
        async with BookKeeper(uri) as bkc:
            for b in mixed.bk_alive():  # the deleted ledgers are gone from each bk bookie's index
                client = bkc.pool.get(b.bookie_id)
                for lid in dead:
                    rc = (await client.call(client.send_read, lid, 0)).rc
                    assert rc in (int(StatusCode.ENOLEDGER), int(StatusCode.ENOENTRY)), (b.bookie_id, lid, rc)
            assert await replicas_hold(bkc, live_id, n) == 3 * n  # every copy, on both kinds

    run_async(check_bk_side())
    answer = java_client("read", uri, "--ledger-id", str(live_id), "--size", str(SIZE), release=RELEASE)
    assert answer["closed"] and answer["lac"] == n - 1 and answer["entries_read"] == n
    assert answer.get("bad_payloads", 0) == 0
    run_async(delete_all(uri))


# ---------------------------------------------------------------------- BP-46
def test_journal_off_bk_bookie_repairs_its_ledgers_from_java_peers(mixed):
    uri = mixed.uri
    cluster = mixed.cluster
    i = max(cluster.bookies) + 1
    # journal off, and no checkpoint before the crash: a SIGKILL loses every entry it took
    jo = cluster.add_bookie(i, journal_write_data=False, flush_interval_ms=3_600_000,
                            data_integrity_repair_retry_max_s=1.0)
    peers = [b.bookie_id for b in mixed.java_alive()]
    n_closed, n_open = 300, 200

    async def write():
        async with BookKeeper(uri) as bkc:
            closed = await write_on(bkc, [jo.bookie_id, peers[0], peers[1]], n_closed, aq=3)
            writer = await BookKeeper.connect(uri)
            # AQ 2: its fencing needs a Java bookie's answer (with AQ 3 the limbo answer alone covers
            # the ensemble and recovery starts from entry 0), and the LAC comes from Java's answers
            opened = await write_on(writer, [jo.bookie_id, peers[1], peers[2]], n_open, aq=2, close=False)
            await writer.close()  # the writer goes away without closing its ledger
            return closed.ledger_id, opened.ledger_id

    closed_id, open_id = run_async(write())
    # and a ledger the Java client wrote over all seven bookies: the bookie knows it only from its
    # Java-written metadata (phase one derives its master key from the password stored there)
    n_java = 300
    java_id = java_bench(uri, "-e", "7", "-w", "3", "-a", "2", n=n_java)["ledger_id"]
    cluster.kill(i)
    cluster.start_bookie(i, wait=False)
    jo.wait_serving()
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            status = http(jo, "GET", "/api/v1/bookie/repair_status")
            if status["repair"] and status["repair"]["state"] == "done":
                break
        except OSError:
            status = None  # the HTTP server starts just after the listener
        assert time.monotonic() < deadline, f"{jo.bookie_id} not repaired: {status}"
        time.sleep(0.3)
    repair = status["repair"]
    assert repair["errors"] == 0 and repair["ledgers_left"] == 0, repair
    # the closed ledgers were lost whole and copied whole (bk's from the Java bookies, Java's
    # share from both kinds); the open one up to the LAC recovery found (the rest was written
    # back by the recovery itself)
    java_share = 3 * n_java // 7  # entry e is on bookies e..e+2 (mod 7) of the ensemble
    assert repair["entries_copied"] >= n_closed + java_share and repair["ledgers_recovered"] == 1, repair
    log = open(jo.log_path).read()
    assert "phase one done: 3 of 3 ledgers fenced and in limbo" in log, log[-3000:]
    assert f"ledger {open_id}: recovered and closed at entry {n_open - 1}" in log, log[-3000:]

    async def check():
        async with BookKeeper(uri) as bkc:
            md = await bkc.get_ledger_metadata(open_id)
            assert md.state == LedgerState.CLOSED and md.last_entry_id == n_open - 1  # recovered, not short
            assert await replicas_hold(bkc, closed_id, n_closed, only=jo.bookie_id) == n_closed
            assert await replicas_hold(bkc, open_id, n_open, only=jo.bookie_id) == n_open
            assert await replicas_hold(bkc, open_id, n_open) == 3 * n_open
            assert await replicas_hold(bkc, java_id, n_java, only=jo.bookie_id) >= java_share

    run_async(check())
    run_async(delete_all(uri))
    assert cluster.stop_bookie(i) == 0  # gone for good, cleanly: it names no ledger


# ---------------------------------------------------------------------- AutoRecovery
class AutoRecoveryProcess:
    """`bk autorecovery --conf FILE` beside one bookie (bk's or Java's: the worker copies to the
    bookie whose address FILE names), its output in a log file."""

    def __init__(self, conf_path: str, bookie_id: str, log_path):
        self.bookie_id = bookie_id
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "bk.cli.main", "autorecovery", "--conf", conf_path],
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def text(self) -> str:
        return self.log_path.read_bytes().decode(errors="replace")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + WAIT_S
        while f"autorecovery for bookie {self.bookie_id} ready" not in self.text():
            assert self.proc.poll() is None, f"bk autorecovery exited {self.proc.returncode}:\n{self.text()[-3000:]}"
            assert time.monotonic() < deadline, self.text()[-3000:]
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def autorecovery_beside_java(mixed, jb: JavaBookie) -> AutoRecoveryProcess:
    """bk's AutoRecovery for a Java bookie: a TOML naming its address, the cluster and the settings."""
    d = mixed.base / f"ar-{jb.port}"
    d.mkdir(exist_ok=True)
    conf = d / "autorecovery.toml"
    write_toml(str(conf), dict(metadata_service_uri=mixed.uri, bookie_port=jb.port, advertised_address="127.0.0.1",
                               journal_dirs=[str(d / "journal")], ledger_dirs=[str(d / "ledgers")],
                               zk_timeout_ms=ZK_TIMEOUT_MS, http_server_enabled=False, **BK_AUTORECOVERY))
    return AutoRecoveryProcess(str(conf), jb.bookie_id, mixed.base / f"ar-{jb.port}.log")


def kind_of(mixed, bookie_id: str) -> str:
    return "java" if any(b.bookie_id == bookie_id for b in mixed.java) else "bk"


def lose_one_of_each_kind(mixed, *, java_kept: JavaBookie | None = None) -> None:
    """Three bk and three Java bookies alive; bk's client writes three ledgers laid out so that the
    lost bk bookie's share can only go to a Java bookie (A) and the lost Java bookie's only to a
    bk bookie (B), C loses both; the Java client writes one (E4, random ensemble: it always fits
    the four survivors). One bookie of each kind (never `java_kept`) is SIGKILLed for good; then
    whatever AutoRecovery runs must bring every ledger back to full replication."""
    bks, javas = mixed.bk_alive(), mixed.java_alive()
    assert len(bks) == 3 and len(javas) == 3, (bks, javas)
    if java_kept is not None:  # the Java bookie that runs AutoRecovery survives: the last one
        javas = [j for j in javas if j is not java_kept] + [java_kept]
    bv, b1, b2 = (b.bookie_id for b in bks)
    jv, j1, j2 = (b.bookie_id for b in javas)
    uri = mixed.uri
    n = 250

    async def write():
        async with BookKeeper(uri) as bkc:
            # AQ = WQ: an acknowledged entry is on every bookie of its write set. With AQ 2 a write
            # to the third bookie that times out after two acks leaves that copy missing while
            # the metadata still names the bookie (BookKeeper's contract: AQ copies), and the
            # check below, every copy on every bookie of its write set, could not hold.
            a = await write_on(bkc, [bv, b1, b2, j1], n, aq=3)
            b = await write_on(bkc, [jv, j1, j2, b1], n, aq=3)
            c = await write_on(bkc, [bv, jv, b1, j1], n, aq=3)
            return {a.ledger_id: n, b.ledger_id: n, c.ledger_id: n}, a.ledger_id, b.ledger_id

    ledgers, a_id, b_id = run_async(write())
    java_written = java_bench(uri, "-e", "4", "-w", "3", "-a", "3", n=n)
    ledgers[java_written["ledger_id"]] = n

    async def written_in_full():  # the starting point: what recovery must restore is all there
        async with BookKeeper(uri) as bkc:
            for lid, count in ledgers.items():
                md = await bkc.get_ledger_metadata(lid)
                try:
                    await replicas_hold(bkc, lid, count)
                except AssertionError as e:
                    raise AssertionError(f"before any bookie was killed (segments {md.segments}): {e}") from None

    run_async(written_in_full(), WAIT_S)

    mixed.cluster.kill(mixed.cluster.index_of(bv))
    javas[0].kill()
    lost = {bv, jv}

    async def recovered():
        async with BookKeeper(uri) as bkc:
            urm = LedgerUnderreplicationManager(bkc.store)
            try:
                async def done():
                    for lid in ledgers:
                        if lost & set((await bkc.get_ledger_metadata(lid)).bookies()):
                            return False
                    # a worker deletes the marker, then releases its lock: both must be gone
                    return not await urm.list_underreplicated_ledgers() and \
                        not await bkc.store.children(urm.paths.ur_locks)
                await until(done, f"every ledger off {sorted(lost)}, no marker and no lock left")
            finally:
                await urm.close()
            # the lost bk bookie's share of A went to the only Java bookie outside A, the lost
            # Java bookie's share of B to the only bk bookie outside B
            assert (await bkc.get_ledger_metadata(a_id)).segments[0][1] == (j2, b1, b2, j1)
            assert (await bkc.get_ledger_metadata(b_id)).segments[0][1] == (b2, j1, j2, b1)
            reads = 0
            for lid, count in ledgers.items():
                md = await bkc.get_ledger_metadata(lid)
                assert md.state == LedgerState.CLOSED and md.last_entry_id == count - 1
                for _, ensemble in md.segments:
                    assert len(set(ensemble)) == md.ensemble_size
                reads += await replicas_hold(bkc, lid, count)
            return reads

    reads = run_async(recovered(), 2 * WAIT_S)
    assert reads == 3 * n * len(ledgers)
    run_async(delete_all(uri))


def test_bk_autorecovery_rereplicates_each_kind_onto_the_other(mixed):
    """(a) bk's auditor and replication workers: `bk autorecovery` beside every bookie that
    survives, bk's and Java's alike; the Java bookies run no AutoRecovery of their own."""
    bks, javas = mixed.bk_alive(), mixed.java_alive()
    survivors_bk, survivors_java = bks[1:], javas[1:]  # lose_one_of_each_kind kills the first of each
    procs = [AutoRecoveryProcess(b.conf_path, b.bookie_id, mixed.base / f"ar-{b.index}.log") for b in survivors_bk]
    procs += [autorecovery_beside_java(mixed, j) for j in survivors_java]
    try:
        for p in procs:
            p.wait_ready()
        lose_one_of_each_kind(mixed)
        logs = "".join(p.text() for p in procs)
        assert "fully replicated" in logs, logs[-3000:]
    finally:
        for p in procs:
            p.stop()


class JavaAutoRecovery:
    """Apache BookKeeper's own AutoRecovery (org.apache.bookkeeper.replication.AutoRecoveryMain:
    its Auditor election and ReplicationWorker) beside a Java bookie, with that bookie's
    configuration plus JAVA_AUTORECOVERY. Not `autoRecoveryDaemonEnabled=true` in the bookie:
    run-bookie.sh writes `autoRecoveryDaemonEnabled=false` itself, a second line from --conf makes
    the property the list [false, true], and the bookie reads false (docs/INTEROP.md)."""

    def __init__(self, jb: JavaBookie, log_path):
        self.bookie_id = jb.bookie_id
        self.log_path = log_path
        conf = jb.directory / "autorecovery.conf"
        lines = [line for line in (jb.directory / "bk_server.conf").read_text().splitlines()
                 if not line.startswith("autoRecoveryDaemonEnabled=")]
        conf.write_text("\n".join(lines + [f"{k}={v}" for k, v in JAVA_AUTORECOVERY.items()]) + "\n")
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                ["bash", str(JAVA_BK / "run-client.sh"), "class", "org.apache.bookkeeper.replication.AutoRecoveryMain",
                 "--conf", str(conf)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "BK_RELEASE": RELEASE, "BK_CLIENT_HEAP": "256m", "BK_CLIENT_LOG_LEVEL": "info"},
                preexec_fn=die_with_parent)

    def text(self) -> str:
        return self.log_path.read_bytes().decode(errors="replace")

    def wait_auditor(self, uri: str) -> None:
        """Until it is the elected auditor (no other AutoRecovery runs)."""
        async def elected():
            assert self.proc.poll() is None, f"AutoRecoveryMain exited {self.proc.returncode}:\n{self.text()[-3000:]}"
            async with BookKeeper(uri) as bkc:
                return await current_auditor(bkc.store) == self.bookie_id
        run_async(until(elected, f"Java's AutoRecovery of {self.bookie_id} elected auditor"), WAIT_S + 30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def test_java_autorecovery_rereplicates_each_kind_onto_the_other(mixed):
    """(b) the Java bookies' own AutoRecovery (AutoRecoveryMain beside a Java bookie) as the
    auditor. Fresh bookies bring the cluster back to three of each kind first. A `bk autorecovery`
    beside the last bk bookie votes after it, as in a cluster half way through replacing Java
    bookies: one election, Java's auditor stays the auditor, both kinds of worker take its markers."""
    cluster = mixed.cluster
    while len(mixed.bk_alive()) < 3:
        cluster.add_bookie(max(cluster.bookies) + 1)
    java_ar = mixed.add_java()
    wait_registered(mixed.uri, mixed.bk_alive() + mixed.java_alive())
    for extra in mixed.java_alive()[:max(0, len(mixed.java_alive()) - 3)]:
        extra.stop()  # run alone: three Java bookies, the AutoRecovery one among them
    ar = JavaAutoRecovery(java_ar, mixed.base / "java-autorecovery.log")
    bk_ar = None
    try:
        ar.wait_auditor(mixed.uri)
        last_bk = mixed.bk_alive()[-1]  # survives lose_one_of_each_kind (it kills the first)
        bk_ar = AutoRecoveryProcess(last_bk.conf_path, last_bk.bookie_id, mixed.base / "ar-beside-java-ar.log")
        bk_ar.wait_ready()
        lose_one_of_each_kind(mixed, java_kept=java_ar)
        assert "Ledger replicated successfully" in ar.text(), ar.text()[-3000:]  # Java's worker did (A at least)
        assert "is the auditor" not in bk_ar.text(), bk_ar.text()[-3000:]

        async def auditor():
            async with BookKeeper(mixed.uri) as bkc:
                return await current_auditor(bkc.store)
        assert run_async(auditor()) == java_ar.bookie_id
    finally:
        if bk_ar is not None:
            bk_ar.stop()
        ar.stop()
