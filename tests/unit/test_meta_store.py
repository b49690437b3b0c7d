"""Metadata store behaviour: versions and CAS, ephemeral and sequential nodes,
one-shot watches, sessions, errors.

Tests marked `@behaviour` take an `env` (sessions on one fresh root) and are
run here on the in-memory store and, by tests/integration/test_meta_zk.py,
unchanged on a real ZooKeeper: both stores must behave the same.
"""
from __future__ import annotations

import asyncio
import functools
import uuid

import pytest

from bk.errors import (
    MetadataExistsError,
    MetadataNotEmptyError,
    MetadataNotFoundError,
    MetadataStoreError,
    MetadataVersionError,
)
from bk.meta import open_store
from bk.meta.memory import InMemoryStore, MemoryTree
from bk.meta.store import EventType, SessionState, WatchEvent, join_path

WAIT_S = 20.0  # upper bound for an event that must come (never a timing assertion)


class StoreEnv:
    """Opens sessions (stores) on one metadata URI with a fresh root; closes them."""

    def __init__(self, uri: str, **store_kwargs):
        self.uri = uri
        self.store_kwargs = store_kwargs
        self.stores = []

    @property
    def root(self) -> str:
        return "/" + self.uri.split("://", 1)[1].split("/", 1)[1]

    def path(self, *parts: str) -> str:
        return join_path(self.root, *parts)

    async def open(self):
        store = await open_store(self.uri, **self.store_kwargs)
        self.stores.append(store)
        return store

    async def close_all(self) -> None:
        for store in self.stores:
            await store.close()


def _loop_factory():
    try:
        import uvloop

        return uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        return asyncio.new_event_loop


def run_async(fn):
    """Run an async test on a fresh event loop; close every StoreEnv it was given."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        async def main():
            try:
                return await asyncio.wait_for(fn(*args, **kwargs), 120)
            finally:
                for value in (*args, *kwargs.values()):
                    if isinstance(value, StoreEnv):
                        await value.close_all()

        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            return runner.run(main())

    return wrapper


def behaviour(fn):
    """An async store-behaviour test, shared with the ZooKeeper integration suite."""
    wrapped = run_async(fn)
    wrapped.shared_behaviour = True
    return wrapped


@pytest.fixture
def env():
    return StoreEnv(f"mem://test-{uuid.uuid4().hex}/ledgers")


class Events:
    """A watcher that records events; `wait(n)` until n have arrived."""

    def __init__(self):
        self.events: list[WatchEvent] = []
        self._changed = asyncio.Event()

    def __call__(self, event: WatchEvent) -> None:
        self.events.append(event)
        self._changed.set()

    async def wait(self, count: int = 1) -> list[WatchEvent]:
        while len(self.events) < count:
            self._changed.clear()
            await asyncio.wait_for(self._changed.wait(), WAIT_S)
        return self.events


# ---------------------------------------------------------------------- data + versions
@behaviour
async def test_create_get_set_versions(env):
    s = await env.open()
    base = env.path("data")
    assert await s.create(base, b"v0", make_parents=True) == base
    assert await s.get(base) == (b"v0", 0)
    assert await s.exists(base) == 0
    assert await s.set(base, b"v1") == 1
    assert await s.set(base, b"v2", 1) == 2
    assert await s.get(base) == (b"v2", 2)
    assert await s.exists(env.path("missing")) is None


@behaviour
async def test_cas_conflicts_raise_version_error_and_change_nothing(env):
    a, b = await env.open(), await env.open()
    path = env.path("cas")
    await a.create(path, b"x", make_parents=True)
    _, version = await a.get(path)
    await b.set(path, b"y", version)  # b wins the race
    with pytest.raises(MetadataVersionError):
        await a.set(path, b"z", version)
    with pytest.raises(MetadataVersionError):
        await a.delete(path, version)
    assert await a.get(path) == (b"y", 1)
    await a.delete(path, 1)
    assert await b.exists(path) is None


@behaviour
async def test_errors_are_translated(env):
    s = await env.open()
    base = env.path("err")
    with pytest.raises(MetadataNotFoundError):
        await s.get(base)
    with pytest.raises(MetadataNotFoundError):
        await s.set(base, b"")
    with pytest.raises(MetadataNotFoundError):
        await s.delete(base)
    with pytest.raises(MetadataNotFoundError):
        await s.children(base)
    with pytest.raises(MetadataNotFoundError):
        await s.create(join_path(base, "child"), b"")  # parent missing
    await s.create(join_path(base, "child"), b"", make_parents=True)
    with pytest.raises(MetadataExistsError):
        await s.create(base, b"")
    with pytest.raises(MetadataNotEmptyError):
        await s.delete(base)
    assert await s.children(base) == ["child"]


@behaviour
async def test_bad_paths_and_data_are_refused(env):
    s = await env.open()
    for bad in ("relative", env.path("x") + "/", env.path("a//b"), env.path("a/../b"), ""):
        with pytest.raises(MetadataStoreError):
            await s.create(bad, b"")
    with pytest.raises(MetadataStoreError):
        await s.create(env.path("text"), "not bytes", make_parents=True)
    with pytest.raises(MetadataStoreError):
        await s.create(env.path("huge"), b"x" * 2_000_000, make_parents=True)
    with pytest.raises(MetadataStoreError):
        await s.delete("/")
    await s.ensure_path(env.root)
    assert await s.children(env.root) == []  # nothing was created by the refused calls


@behaviour
async def test_children_sorted_and_recursive_delete(env):
    s = await env.open()
    base = env.path("tree")
    for name in ("b", "a", "c/d/e", "c/f"):
        await s.create(join_path(base, name), name.encode(), make_parents=True)
    assert await s.children(base) == ["a", "b", "c"]
    assert await s.children(join_path(base, "c")) == ["d", "f"]
    await s.delete(join_path(base, "c"), recursive=True)
    assert await s.children(base) == ["a", "b"]
    await s.delete(base, recursive=True)
    assert await s.exists(base) is None


@behaviour
async def test_ensure_path_is_idempotent(env):
    s = await env.open()
    deep = env.path("x", "y", "z")
    await s.ensure_path(deep)
    await s.ensure_path(deep)
    assert await s.get(deep) == (b"", 0)


# ---------------------------------------------------------------------- ephemeral
@behaviour
async def test_ephemeral_nodes_vanish_when_session_closes(env):
    a, b = await env.open(), await env.open()
    await a.ensure_path(env.root)
    path = env.path("eph")
    await b.create(path, b"live", ephemeral=True)
    assert await a.get(path) == (b"live", 0)
    await b.close()
    assert await a.exists(path) is None
    with pytest.raises(MetadataStoreError):
        await b.get(path)  # a closed session is unusable


@behaviour
async def test_get_with_owner_names_the_ephemeral_owner_session(env):
    a, b = await env.open(), await env.open()
    await a.ensure_path(env.root)
    eph, persistent = env.path("owned"), env.path("persistent")
    await b.create(eph, b"lock", ephemeral=True)
    await b.create(persistent, b"p")
    assert await a.get_with_owner(eph) == (b"lock", 0, b.session_id) and b.session_id != a.session_id
    assert await a.get_with_owner(persistent) == (b"p", 0, 0)
    with pytest.raises(MetadataNotFoundError):
        await a.get_with_owner(env.path("missing"))
    assert not b.closed
    await b.close()
    assert b.closed and not a.closed


@behaviour
async def test_ephemeral_nodes_vanish_when_session_expires(env):
    a, b = await env.open(), await env.open()
    await a.ensure_path(env.root)
    path = env.path("eph")
    await b.create(path, b"", ephemeral=True)
    await b.create(env.path("persistent"), b"")
    old_session = b.session_id
    await b.expire_session()
    assert b.session_id != old_session
    assert await a.exists(path) is None
    assert await a.exists(env.path("persistent")) == 0
    # the store carries on with its new session
    await b.create(path, b"again", ephemeral=True)
    assert await a.get(path) == (b"again", 0)


@behaviour
async def test_ephemeral_nodes_cannot_have_children(env):
    s = await env.open()
    await s.ensure_path(env.root)
    path = env.path("eph")
    await s.create(path, b"", ephemeral=True)
    with pytest.raises(MetadataStoreError) as info:
        await s.create(join_path(path, "child"), b"")
    assert not isinstance(info.value, (MetadataNotFoundError, MetadataExistsError))


@behaviour
async def test_session_listener_sees_expiry_then_new_session(env):
    s = await env.open()
    states = []
    s.add_session_listener(states.append)
    await s.expire_session()
    await asyncio.sleep(0)
    assert SessionState.EXPIRED in states
    assert states.index(SessionState.EXPIRED) < len(states) - 1
    assert states[-1] is SessionState.CONNECTED


# ---------------------------------------------------------------------- sequential
@behaviour
async def test_sequential_nodes_count_per_parent_like_zookeeper(env):
    s = await env.open()
    q1, q2 = env.path("q1"), env.path("q2")
    await s.ensure_path(q1)
    await s.ensure_path(q2)
    first = await s.create(join_path(q1, "n-"), b"", sequential=True)
    assert first == join_path(q1, "n-0000000000")
    await s.create(join_path(q1, "plain"), b"")  # any child creation advances the counter
    second = await s.create(join_path(q1, "n-"), b"", sequential=True)
    assert second == join_path(q1, "n-0000000002")
    await s.delete(second)
    third = await s.create(join_path(q1, "n-"), b"", sequential=True)
    assert third == join_path(q1, "n-0000000003")  # never reused after a delete
    # a separate counter per parent
    assert await s.create(join_path(q2, "x"), b"", sequential=True) == join_path(q2, "x0000000000")


@behaviour
async def test_ephemeral_sequential_nodes(env):
    a, b = await env.open(), await env.open()
    base = env.path("election")
    await a.ensure_path(base)
    va = await a.create(join_path(base, "V_"), b"a", ephemeral=True, sequential=True)
    vb = await b.create(join_path(base, "V_"), b"b", ephemeral=True, sequential=True)
    assert va < vb and len(vb.rsplit("V_", 1)[1]) == 10
    await a.close()
    assert await b.children(base) == [vb.rsplit("/", 1)[1]]


# ---------------------------------------------------------------------- watches
@behaviour
async def test_data_watch_fires_once(env):
    a, b = await env.open(), await env.open()
    path = env.path("w")
    await a.create(path, b"0", make_parents=True)
    watcher = Events()
    await a.get(path, watcher)
    await b.set(path, b"1")
    assert await watcher.wait(1) == [WatchEvent(EventType.CHANGED, path)]
    # A second change must not reach the one-shot watch. The sentinel is a later
    # watch of the same session, so its event arrives after any event of the first.
    sentinel = Events()
    await a.exists(path, sentinel)
    await b.set(path, b"2")
    await sentinel.wait(1)
    assert len(watcher.events) == 1


@behaviour
async def test_same_watcher_twice_on_a_node_fires_once(env):
    a, b = await env.open(), await env.open()
    path = env.path("w2")
    await a.create(path, b"", make_parents=True)
    watcher = Events()
    await a.get(path, watcher)
    await a.exists(path, watcher)
    await b.set(path, b"x")
    await watcher.wait(1)
    sentinel = Events()
    await a.exists(path, sentinel)
    await b.set(path, b"y")
    await sentinel.wait(1)
    assert watcher.events == [WatchEvent(EventType.CHANGED, path)]


@behaviour
async def test_exists_watch_on_missing_node_fires_on_create_and_delete(env):
    a, b = await env.open(), await env.open()
    await a.ensure_path(env.root)
    path = env.path("later")
    version, created = await a.exists_watched(path)
    assert version is None
    await b.create(path, b"")
    assert await asyncio.wait_for(created, WAIT_S) == WatchEvent(EventType.CREATED, path)
    _, _, deleted = await a.get_watched(path)
    await b.delete(path)
    assert await asyncio.wait_for(deleted, WAIT_S) == WatchEvent(EventType.DELETED, path)


@behaviour
async def test_child_watch_fires_on_create_and_delete_of_children(env):
    a, b = await env.open(), await env.open()
    base = env.path("kids")
    await a.ensure_path(base)
    names, fut = await a.children_watched(base)
    assert names == []
    await b.create(join_path(base, "k1"), b"")
    assert await asyncio.wait_for(fut, WAIT_S) == WatchEvent(EventType.CHILD, base)
    names, fut = await a.children_watched(base)
    assert names == ["k1"]
    await b.set(join_path(base, "k1"), b"data")  # data changes of a child are not child events
    await b.delete(join_path(base, "k1"))
    assert await asyncio.wait_for(fut, WAIT_S) == WatchEvent(EventType.CHILD, base)
    _, fut = await a.children_watched(base)
    await b.delete(base)
    assert await asyncio.wait_for(fut, WAIT_S) == WatchEvent(EventType.DELETED, base)


@behaviour
async def test_watch_of_expired_session_fires_disconnected(env):
    a, b = await env.open(), await env.open()
    path = env.path("x")
    await a.create(path, b"", make_parents=True)
    _, _, fut = await b.get_watched(path)
    await b.expire_session()
    event = await asyncio.wait_for(fut, WAIT_S)
    assert event == WatchEvent(EventType.DISCONNECTED, path)


@behaviour
async def test_watch_sees_ephemeral_owner_expire(env):
    a, b = await env.open(), await env.open()
    await a.ensure_path(env.root)
    path = env.path("owner")
    await b.create(path, b"", ephemeral=True)
    _, fut = await a.exists_watched(path)
    await b.expire_session()
    assert await asyncio.wait_for(fut, WAIT_S) == WatchEvent(EventType.DELETED, path)


# ---------------------------------------------------------------------- memory-only
@run_async
async def test_memory_sessions_share_a_named_tree_and_private_trees_are_separate():
    name = f"t-{uuid.uuid4().hex}"
    a = await open_store(f"mem://{name}/ledgers")
    b = await open_store(f"mem://{name}/other")
    assert a.tree is b.tree and a.session_id != b.session_id
    assert (a.ledgers_root, b.ledgers_root) == ("/ledgers", "/other")
    await a.create("/shared", b"1")
    assert await b.get("/shared") == (b"1", 0)
    private = InMemoryStore()
    assert await private.exists("/shared") is None
    InMemoryStore.drop_shared(name)
    c = InMemoryStore.shared(name)
    assert await c.exists("/shared") is None


@run_async
async def test_memory_closed_session_watches_never_fire():
    tree = MemoryTree("t")
    a, b = InMemoryStore(tree), InMemoryStore(tree)
    await a.create("/n", b"")
    watcher = Events()
    await a.get("/n", watcher)
    await a.close()
    sentinel = Events()
    await b.get("/n", sentinel)
    await b.set("/n", b"x")
    await sentinel.wait(1)
    assert watcher.events == []


@run_async
async def test_memory_watch_is_not_run_inside_the_triggering_call():
    s = InMemoryStore()
    await s.create("/n", b"")
    calls = []
    await s.get("/n", lambda ev: calls.append(ev))
    await s.set("/n", b"x")
    assert calls == []  # delivered later by the loop, as events from a server are
    await asyncio.sleep(0)
    assert calls == [WatchEvent(EventType.CHANGED, "/n")]


def test_memory_watch_delivered_to_the_registering_loop_from_another_thread():
    import threading

    tree = MemoryTree("threads")
    got = []

    async def main():
        a = InMemoryStore(tree)
        await a.create("/n", b"")
        _, _, fut = await a.get_watched("/n")

        def other_thread():
            asyncio.run(InMemoryStore(tree).set("/n", b"x"))

        t = threading.Thread(target=other_thread)
        t.start()
        got.append(await asyncio.wait_for(fut, WAIT_S))
        t.join()

    asyncio.run(main())
    assert got == [WatchEvent(EventType.CHANGED, "/n")]


@run_async
async def test_bad_uris_are_refused():
    for bad in ("ledgers", "http://x/ledgers", "zk:///ledgers", "mem:///ledgers", "zk://h:notaport/ledgers"):
        with pytest.raises(MetadataStoreError):
            await open_store(bad)
