"""Cluster init, LedgerManager, RegistrationManager, cookies and the
under-replication queue, written against the store interface.

Every `@behaviour` test here also runs on a real ZooKeeper from
tests/integration/test_meta_zk.py; here it runs on the in-memory store.
"""
from __future__ import annotations

import asyncio
import os
import pathlib
import sys
import uuid

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from test_meta_store import WAIT_S, StoreEnv, behaviour, env  # noqa: E402,F401  (env: fixture)

from bk.errors import (  # noqa: E402
    CookieError,
    LedgerClosedError,
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataStoreError,
    MetadataVersionError,
    NoSuchLedgerMetadataError,
)
from bk.meta import formats  # noqa: E402
from bk.meta.cluster import (  # noqa: E402
    LAYOUT_DATA,
    MetadataPaths,
    init_new_cluster,
    is_initialized,
    read_instance_id,
    read_layout,
)
from bk.meta.cookie import (  # noqa: E402
    Cookie,
    CookieStore,
    cookie_file,
    read_directory_cookie,
    verify_cookies,
    write_directory_cookie,
)
from bk.meta.ledger_manager import LedgerManager  # noqa: E402
from bk.meta.ledger_metadata import LedgerMetadata, LedgerState  # noqa: E402
from bk.meta.registration import BookieServiceInfo, RegistrationManager  # noqa: E402
from bk.meta.underreplication import LedgerUnderreplicationManager  # noqa: E402

from test_meta_formats import decode_ledger_znode  # noqa: E402

BOOKIES = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")


async def until(predicate, what: str):
    """Poll an async predicate until true (bounded; never a timing assertion)."""
    for _ in range(int(WAIT_S / 0.02)):
        if await predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def cluster(env: StoreEnv):
    store = await env.open()
    await init_new_cluster(store)
    return store


def new_metadata(bookies=BOOKIES[:2]) -> LedgerMetadata:
    return LedgerMetadata.new(list(bookies), 2, 2, password=b"secret", custom_metadata={"app": b"test"})


# ---------------------------------------------------------------------- cluster
@behaviour
async def test_init_new_cluster_lays_out_bookkeepers_tree(env):
    s = await env.open()
    assert not await is_initialized(s)
    with pytest.raises(MetadataNotFoundError, match="not initialised"):
        await read_instance_id(s)
    instance_id = await init_new_cluster(s)
    assert str(uuid.UUID(instance_id)) == instance_id
    assert await read_instance_id(s) == instance_id
    assert await is_initialized(s)
    paths = MetadataPaths(env.root)
    assert (await s.get(paths.layout))[0] == b"2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1"
    assert LAYOUT_DATA == (await s.get(paths.layout))[0]
    assert await read_layout(s) == (2, "org.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory", 1)
    for path in (paths.available, paths.readonly, paths.cookies, paths.underreplication, paths.ur_ledgers):
        assert await s.exists(path) is not None, path
    with pytest.raises(MetadataExistsError, match="already initialised"):
        await init_new_cluster(s)
    assert await read_instance_id(s) == instance_id


# ---------------------------------------------------------------------- ledgers
@behaviour
async def test_ledger_ids_are_unique_across_sessions_and_idgen_is_left_empty(env):
    a = await cluster(env)
    b = await env.open()
    lm_a, lm_b = LedgerManager(a), LedgerManager(b)
    ids = []
    for _ in range(5):
        ids.append(await lm_a.generate_ledger_id())
        ids.append(await lm_b.generate_ledger_id())
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    assert await a.children(MetadataPaths(env.root).idgen) == []


@behaviour
async def test_ledger_metadata_create_read_cas_write(env):
    a = await cluster(env)
    b = await env.open()
    lm_a, lm_b = LedgerManager(a), LedgerManager(b)
    ledger_id = await lm_a.generate_ledger_id()
    md = new_metadata()
    assert await lm_a.create_ledger_metadata(ledger_id, md) == 0
    with pytest.raises(MetadataExistsError):
        await lm_b.create_ledger_metadata(ledger_id, md)
    read, version = await lm_b.read_ledger_metadata(ledger_id)
    assert (read, version) == (md, 0)
    closed = read.with_closed(9, 1000)
    assert await lm_b.write_ledger_metadata(ledger_id, closed, version) == 1
    with pytest.raises(MetadataVersionError):  # a's copy is stale now
        await lm_a.write_ledger_metadata(ledger_id, md.with_in_recovery(), 0)
    assert await lm_a.read_ledger_metadata(ledger_id) == (closed, 1)
    with pytest.raises(NoSuchLedgerMetadataError):
        await lm_a.read_ledger_metadata(ledger_id + 1)
    with pytest.raises(NoSuchLedgerMetadataError):
        await lm_a.write_ledger_metadata(ledger_id + 1, md, 0)


@behaviour
async def test_update_loop_rereads_and_redecides_after_a_conflict(env):
    a = await cluster(env)
    b = await env.open()
    lm_a, lm_b = LedgerManager(a), LedgerManager(b)
    await lm_a.create_ledger_metadata(5, new_metadata())
    seen_states = []

    async def recover(current: LedgerMetadata):
        seen_states.append(current.state)
        if len(seen_states) == 1:
            # a concurrent writer closes the ledger between our read and our write
            cur, version = await lm_b.read_ledger_metadata(5)
            await lm_b.write_ledger_metadata(5, cur.with_closed(3, 30), version)
        if current.is_closed:
            return None  # already closed by someone else: nothing left to do
        return current.with_in_recovery()

    md, version = await lm_a.update_ledger_metadata(5, recover)
    assert seen_states == [LedgerState.OPEN, LedgerState.CLOSED]
    assert (md.state, md.last_entry_id, md.length, version) == (LedgerState.CLOSED, 3, 30, 1)
    # an update that raises abandons without writing
    with pytest.raises(LedgerClosedError):
        await lm_a.update_ledger_metadata(5, lambda m: m.with_closed(4, 40))
    assert (await lm_a.read_ledger_metadata(5))[1] == 1


@behaviour
async def test_ledger_paths_and_listing_skip_non_ledger_nodes(env):
    s = await cluster(env)
    lm = LedgerManager(s)
    ids = [1, 9999, 10000, 1234567890, 2**31 - 2]
    for ledger_id in ids:
        await lm.create_ledger_metadata(ledger_id, new_metadata())
    assert await s.exists(env.path("00", "0000", "L0001")) == 0
    assert await s.exists(env.path("12", "3456", "L7890")) == 0
    assert await s.exists(env.path("00", "0001", "L0000")) == 0
    # junk the walk must ignore
    await s.create(env.path("ab"), b"")
    await s.create(env.path("12", "zz"), b"")
    await s.create(env.path("12", "3456", "Lxyzw"), b"")
    await s.create(env.path("12", "3456", "7891"), b"")
    assert await lm.list_ledger_ids() == sorted(ids)
    # ids from 2^31-1 on: BookKeeper's long layout (3/4/4/4/4), listed after the short ones
    long_ids = [2**31 - 1, (1 << 32) | 7, 2**63 - 1]
    for ledger_id in long_ids:
        await lm.create_ledger_metadata(ledger_id, new_metadata())
    assert await s.exists(env.path("000", "0000", "0021", "4748", "L3647")) == 0
    await s.create(env.path("000", "0000", "junk"), b"")
    assert await lm.list_ledger_ids() == sorted(ids) + long_ids
    md, _ = await lm.read_ledger_metadata(2**63 - 1)
    assert md.ensemble_size == new_metadata().ensemble_size
    with pytest.raises(MetadataStoreError):
        await lm.create_ledger_metadata(2**63, new_metadata())
    with pytest.raises(MetadataStoreError, match="negative"):
        await lm.read_ledger_metadata(-1)


@behaviour
async def test_long_ledger_ids_come_from_idgen_long_once_it_exists(env):
    """A cluster whose short counter overflowed has <root>/idgen-long (BookKeeper's
    LongZkLedgerIdGenerator): ids are (HOB << 32) | sequence, stored in the long layout,
    and deleting one prunes its four levels."""
    s = await cluster(env)
    lm = LedgerManager(s)
    short = await lm.generate_ledger_id()
    assert short < 2**31 - 1
    await s.create(env.path("idgen-long"), b"")
    first, second = await lm.generate_ledger_id(), await lm.generate_ledger_id()
    assert first >> 32 == 1 and second >> 32 == 1 and second > first >= 1 << 32
    assert await s.children(env.path("idgen-long")) == ["HOB-0000000001"]
    assert await s.children(env.path("idgen-long", "HOB-0000000001")) == []
    await lm.create_ledger_metadata(first, new_metadata())
    assert await lm.list_ledger_ids() == [first]
    await lm.remove_ledger_metadata(first)
    assert await s.exists(env.path("000")) is None
    # a Java client's newer HOB- directory wins: ids continue above it
    await s.create(env.path("idgen-long", "HOB-0000000005"), b"")
    assert (await lm.generate_ledger_id()) >> 32 == 5


@behaviour
async def test_remove_ledger_prunes_empty_levels_only(env):
    s = await cluster(env)
    lm = LedgerManager(s)
    for ledger_id in (1, 2, 10000):
        await lm.create_ledger_metadata(ledger_id, new_metadata())
    with pytest.raises(MetadataVersionError):
        await lm.remove_ledger_metadata(1, version=7)
    await lm.remove_ledger_metadata(1, version=0)
    assert await s.children(env.path("00", "0000")) == ["L0002"]
    await lm.remove_ledger_metadata(2)
    assert await s.children(env.path("00")) == ["0001"]
    await lm.remove_ledger_metadata(10000)
    assert await s.exists(env.path("00")) is None
    assert await lm.list_ledger_ids() == []
    with pytest.raises(NoSuchLedgerMetadataError):
        await lm.remove_ledger_metadata(1)


@behaviour
async def test_ledger_znode_bytes_decode_with_an_independent_protobuf_reader(env):
    s = await cluster(env)
    lm = LedgerManager(s)
    md = new_metadata(BOOKIES).with_ensemble_change(7, [BOOKIES[0], "10.0.0.9:3181", BOOKIES[2]])
    md = md.with_closed(41, 123456)
    await lm.create_ledger_metadata(77, md)
    raw, _ = await s.get(env.path("00", "0000", "L0077"))
    assert raw.startswith(b"BookieMetadataFormatVersion\t3\n")
    fields = decode_ledger_znode(raw)
    assert fields["quorumSize"] == 2 and fields["ensembleSize"] == 3 and fields["ackQuorumSize"] == 2
    assert fields["length"] == 123456 and fields["lastEntryId"] == 41 and fields["state"] == 3
    assert fields["segments"] == [(0, list(BOOKIES)), (7, [BOOKIES[0], "10.0.0.9:3181", BOOKIES[2]])]
    assert fields["digestType"] == 3 and fields["password"] == b"secret"
    assert fields["customMetadata"] == [("app", b"test")]
    assert fields["ctime"] == md.ctime and fields["cToken"] == md.ctoken


@behaviour
async def test_ledger_metadata_watch_reports_changes_and_deletion(env):
    a = await cluster(env)
    b = await env.open()
    lm_a, lm_b = LedgerManager(a), LedgerManager(b)
    await lm_a.create_ledger_metadata(3, new_metadata())
    seen = []
    changed = asyncio.Event()

    def listener(md, version):
        seen.append((md.state if md else None, version))
        changed.set()

    watch = await lm_a.watch_ledger_metadata(3, listener)
    assert watch.version == 0 and watch.metadata.state is LedgerState.OPEN and watch.active
    await lm_b.update_ledger_metadata(3, lambda m: m.with_in_recovery())
    await until(lambda: _true(len(seen) >= 1), "first change")
    await lm_b.update_ledger_metadata(3, lambda m: m.with_closed(0, 10))
    await until(lambda: _true(len(seen) >= 2), "second change")
    await lm_b.remove_ledger_metadata(3)
    await until(lambda: _true(len(seen) >= 3), "deletion")
    assert seen == [(LedgerState.IN_RECOVERY, 1), (LedgerState.CLOSED, 2), (None, None)]
    await until(lambda: _true(not watch.active), "watch end")
    with pytest.raises(NoSuchLedgerMetadataError):
        await lm_a.watch_ledger_metadata(3, listener)


async def _true(value):
    return value


# ---------------------------------------------------------------------- registration
@behaviour
async def test_register_switch_unregister_and_list(env):
    s = await cluster(env)
    observer = RegistrationManager(await env.open())
    rm = RegistrationManager(s)
    await rm.register(BOOKIES[0])
    await rm.register(BOOKIES[1])
    assert await observer.writable_bookies() == [BOOKIES[0], BOOKIES[1]]
    assert await observer.registration(BOOKIES[0]) == "writable"
    await rm.register(BOOKIES[0], readonly=True)
    assert await observer.writable_bookies() == [BOOKIES[1]]
    assert await observer.readonly_bookies() == [BOOKIES[0]]
    assert await observer.registration(BOOKIES[0]) == "readonly"
    await rm.register(BOOKIES[0], readonly=False)
    assert await observer.readonly_bookies() == []
    info = await observer.get_service_info(BOOKIES[0])
    assert info == BookieServiceInfo.for_bookie(BOOKIES[0])
    endpoint = info.endpoints[0]
    assert (endpoint.host, endpoint.port, endpoint.protocol) == ("127.0.0.1", 3181, "bookie-rpc")
    await rm.unregister(BOOKIES[0])
    assert await observer.writable_bookies() == [BOOKIES[1]]
    assert await observer.registration(BOOKIES[0]) is None
    with pytest.raises(MetadataStoreError):
        await rm.register("readonly")


@behaviour
async def test_registration_vanishes_with_the_session_and_watch_rearms(env):
    s = await cluster(env)
    observer = RegistrationManager(await env.open())
    sets = []
    watch = await observer.watch_writable_bookies(sets.append)
    assert watch.bookies == frozenset()
    bookie_store = await env.open()
    rm = RegistrationManager(bookie_store)
    await rm.register(BOOKIES[0])
    await until(lambda: _true(sets[-1:] == [frozenset({BOOKIES[0]})]), "registration seen")
    await RegistrationManager(s).register(BOOKIES[1])
    await until(lambda: _true(sets[-1:] == [frozenset(BOOKIES[:2])]), "second registration seen")
    await bookie_store.close()  # the bookie dies: its ephemeral node goes
    await until(lambda: _true(sets[-1:] == [frozenset({BOOKIES[1]})]), "death seen")
    assert await observer.writable_bookies() == [BOOKIES[1]]
    watch.cancel()


@behaviour
async def test_bookie_registers_again_after_session_expiry(env):
    await cluster(env)
    bookie_store = await env.open()
    observer = RegistrationManager(await env.open())
    rm = RegistrationManager(bookie_store)
    await rm.register(BOOKIES[2], readonly=True)
    await bookie_store.expire_session()
    await until(lambda: _readonly_is(observer, [BOOKIES[2]]), "re-registration")
    assert await observer.writable_bookies() == []
    await rm.close()


async def _readonly_is(rm, expected):
    return await rm.readonly_bookies() == expected


@behaviour
async def test_a_live_twin_with_the_same_bookie_id_is_refused(env):
    s = await cluster(env)
    await RegistrationManager(s).register(BOOKIES[0])
    twin = RegistrationManager(await env.open(), stale_registration_timeout_s=0.3)
    with pytest.raises(MetadataExistsError, match="already registered"):
        await twin.register(BOOKIES[0])


@behaviour
async def test_a_stale_registration_is_waited_out(env):
    await cluster(env)
    old = await env.open()
    await RegistrationManager(old).register(BOOKIES[0])
    new = RegistrationManager(await env.open(), stale_registration_timeout_s=WAIT_S)
    registering = asyncio.ensure_future(new.register(BOOKIES[0]))
    await asyncio.sleep(0.05)
    assert not registering.done()
    await old.close()  # the old session ends: its node goes, the new one takes over
    await asyncio.wait_for(registering, WAIT_S)
    assert await new.registration(BOOKIES[0]) == "writable"


# ---------------------------------------------------------------------- cookies
@behaviour
async def test_cookie_store_create_read_cas_delete(env):
    s = await cluster(env)
    cookies = CookieStore(s)
    cookie = Cookie(BOOKIES[0], ("/j",), ("/l1", "/l2"), "iid")
    assert await cookies.write(BOOKIES[0], cookie) == 0
    with pytest.raises(MetadataExistsError):
        await cookies.write(BOOKIES[0], cookie)
    assert await cookies.read(BOOKIES[0]) == (cookie, 0)
    raw, _ = await s.get(MetadataPaths(env.root).cookie(BOOKIES[0]))
    assert raw == cookie.to_bytes()
    moved = Cookie(BOOKIES[0], ("/j",), ("/l1", "/l2", "/l3"), "iid")
    assert await cookies.write(BOOKIES[0], moved, 0) == 1
    with pytest.raises(MetadataVersionError):
        await cookies.write(BOOKIES[0], cookie, 0)
    with pytest.raises(MetadataVersionError):
        await cookies.delete(BOOKIES[0], 0)
    await cookies.delete(BOOKIES[0], 1)
    with pytest.raises(MetadataNotFoundError):
        await cookies.read(BOOKIES[0])


@behaviour
async def test_verify_cookies_stamps_a_new_bookie_then_accepts_it(env, tmp_path):
    s = await cluster(env)
    j, l1, l2, idx = (str(tmp_path / n) for n in ("journal", "ledgers1", "ledgers2", "index"))
    check = await verify_cookies(s, BOOKIES[0], [j], [l1, l2], idx)
    assert check.new_bookie and check.ok
    instance_id = await read_instance_id(s)
    expected = Cookie(BOOKIES[0], (j,), (l1, l2), instance_id, (idx,))
    for directory in (j, l1, l2, idx):
        assert read_directory_cookie(directory) == expected
    assert (await CookieStore(s).read(BOOKIES[0]))[0] == expected
    again = await verify_cookies(s, BOOKIES[0], [j], [l1, l2], idx)
    assert not again.new_bookie and again.ok and again.zk_version == 0


@behaviour
async def test_verify_cookies_refuses_mismatches_naming_the_directory(env, tmp_path):
    s = await cluster(env)
    j, l1, l2, l3 = (str(tmp_path / n) for n in ("journal", "l1", "l2", "l3"))
    await verify_cookies(s, BOOKIES[0], [j], [l1, l2])

    # a ledger directory added to the configuration: it has no cookie
    with pytest.raises(CookieError) as info:
        await verify_cookies(s, BOOKIES[0], [j], [l1, l2, l3])
    assert l3 in str(info.value) and "no cookie" in str(info.value)
    assert "ledger_dirs" in str(info.value)

    # a directory whose cookie was lost (disk replaced)
    os.unlink(cookie_file(l2))
    with pytest.raises(CookieError, match=f"{l2} has no cookie"):
        await verify_cookies(s, BOOKIES[0], [j], [l1, l2])
    write_directory_cookie(l2, read_directory_cookie(l1))  # put it back

    # another cluster's cookie
    with pytest.raises(CookieError, match="instance_id"):
        await verify_cookies(s, BOOKIES[0], [j], [l1, l2], instance_id="other-cluster")

    # the ZooKeeper cookie deleted while the directories still have theirs
    await CookieStore(s).delete(BOOKIES[0])
    with pytest.raises(CookieError, match="ZooKeeper has no cookie"):
        await verify_cookies(s, BOOKIES[0], [j], [l1, l2])

    # repair mode reports instead of raising
    check = await verify_cookies(s, BOOKIES[0], [j], [l1, l2], allow_repair=True)
    assert not check.ok and check.zk_version is None
    assert any("ZooKeeper has no cookie" in p for p in check.problems)


@behaviour
async def test_verify_cookies_refuses_data_without_any_cookie(env, tmp_path):
    s = await cluster(env)
    j, l1 = str(tmp_path / "j"), str(tmp_path / "l1")
    os.makedirs(os.path.join(l1, "current"))
    with open(os.path.join(l1, "current", "0.log"), "wb") as f:
        f.write(b"data")
    with pytest.raises(CookieError, match=f"{l1} has no cookie.*with data"):
        await verify_cookies(s, BOOKIES[0], [j], [l1])
    with pytest.raises(MetadataNotFoundError):  # nothing was stamped
        await CookieStore(s).read(BOOKIES[0])


# ---------------------------------------------------------------------- under-replication
@behaviour
async def test_mark_underreplicated_merges_replicas(env):
    a = await cluster(env)
    b = await env.open()
    ur_a, ur_b = LedgerUnderreplicationManager(a), LedgerUnderreplicationManager(b)
    ledger_id = 0x0001_0002_0003_0004
    await ur_a.mark_ledger_underreplicated(ledger_id, [BOOKIES[0]])
    path = env.path("underreplication", "ledgers", "0001", "0002", "0003", "0004", f"urL{ledger_id:010d}")
    assert ur_a.marker_path(ledger_id) == path
    raw, _ = await a.get(path)
    parsed = formats.from_text(formats.UnderreplicatedLedgerFormat, raw)
    assert list(parsed.replica) == [BOOKIES[0]] and parsed.ctime > 0
    await asyncio.gather(
        ur_a.mark_ledger_underreplicated(ledger_id, [BOOKIES[1]]),
        ur_b.mark_ledger_underreplicated(ledger_id, [BOOKIES[2], BOOKIES[0]]),
    )
    info = await ur_b.get_ledger_unreplication_info(ledger_id)
    assert sorted(info.replicas) == sorted(BOOKIES) and info.ctime_ms == parsed.ctime
    await ur_a.mark_ledger_underreplicated(7, [BOOKIES[0]])
    assert await ur_b.list_underreplicated_ledgers() == [7, ledger_id]
    assert await ur_b.get_ledger_unreplication_info(8) is None


@behaviour
async def test_replication_locks_and_marking_replicated(env):
    a = await cluster(env)
    b = await env.open()
    worker_a, worker_b = LedgerUnderreplicationManager(a), LedgerUnderreplicationManager(b)
    await worker_a.mark_ledger_underreplicated(11, [BOOKIES[0]])
    taken = await worker_a.poll_ledger_to_rereplicate("worker-a")
    assert taken.ledger_id == 11 and taken.replicas == (BOOKIES[0],)
    assert await worker_b.lock_holder(11) == "worker-a"
    raw, _ = await b.get(env.path("underreplication", "locks", "urL0000000011"))
    assert formats.from_text(formats.LockDataFormat, raw).bookieId == "worker-a"
    assert await worker_b.poll_ledger_to_rereplicate("worker-b") is None  # locked
    assert not await worker_b.acquire_ledger_lock(11, "worker-b")
    await worker_b.release_ledger_lock(11)  # not b's lock: kept
    assert await worker_b.lock_holder(11) == "worker-a"

    # the auditor finds another missing bookie while a works: a's removal must not win
    await worker_b.mark_ledger_underreplicated(11, [BOOKIES[1]])
    assert not await worker_a.mark_ledger_replicated(11, taken.version)
    assert await worker_b.is_ledger_underreplicated(11)
    assert await worker_b.lock_holder(11) is None  # a released its lock anyway

    taken = await worker_b.poll_ledger_to_rereplicate("worker-b")
    assert taken.replicas == (BOOKIES[0], BOOKIES[1])
    await b.close()  # worker b dies: its lock goes with its session
    assert await worker_a.lock_holder(11) is None
    taken = await worker_a.poll_ledger_to_rereplicate("worker-a")
    assert await worker_a.mark_ledger_replicated(11, taken.version)
    assert await worker_a.list_underreplicated_ledgers() == []
    assert await a.children(env.path("underreplication", "ledgers")) == []  # levels pruned


@behaviour
async def test_replication_switch_and_lost_bookie_delay(env):
    a = await cluster(env)
    b = await env.open()
    ur_a, ur_b = LedgerUnderreplicationManager(a), LedgerUnderreplicationManager(b)
    assert await ur_a.is_ledger_replication_enabled()
    await ur_a.disable_ledger_replication()
    await ur_a.disable_ledger_replication()
    assert not await ur_b.is_ledger_replication_enabled()
    waiting = asyncio.ensure_future(ur_b.wait_until_replication_enabled())
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await ur_a.enable_ledger_replication()
    await asyncio.wait_for(waiting, WAIT_S)

    assert await ur_a.get_lost_bookie_recovery_delay(default_s=30) == 30
    delay, changed = await ur_b.lost_bookie_recovery_delay_watched(default_s=30)
    assert delay == 30
    await ur_a.set_lost_bookie_recovery_delay(5)
    await asyncio.wait_for(changed, WAIT_S)
    assert await ur_b.get_lost_bookie_recovery_delay() == 5
    await ur_a.set_lost_bookie_recovery_delay(0)
    raw, _ = await a.get(MetadataPaths(env.root).lost_bookie_recovery_delay)
    assert raw == b"0"
    with pytest.raises(MetadataStoreError):
        await ur_a.set_lost_bookie_recovery_delay(-1)


def test_short_counter_overflow_switches_to_idgen_long():
    """The in-memory store lets the test put the idgen counter at 2^31-1 (ZooKeeper would need
    two billion creates): the next id comes from idgen-long, as BookKeeper's generator does."""
    from bk.meta.memory import InMemoryStore

    async def main():
        store = InMemoryStore()
        await init_new_cluster(store)
        lm = LedgerManager(store)
        await lm.generate_ledger_id()
        store.tree.find(lm.paths.idgen).cversion = 2**31 - 1
        ledger_id = await lm.generate_ledger_id()
        assert ledger_id == (1 << 32) | 0
        assert await store.children(lm.root + "/idgen-long") == ["HOB-0000000001"]
        store.tree.find(lm.root + "/idgen-long/HOB-0000000001").cversion = 2**31 - 1  # that HOB- is full too
        assert await lm.generate_ledger_id() == (2 << 32) | 0
    asyncio.run(main())
