"""ZooKeeperStore: the metadata store over kazoo. The only module that imports kazoo.

kazoo runs its own threads (connection, completion, event dispatch). This
module is the one bridge between them and asyncio:
- every operation uses kazoo's `*_async` call, whose IAsyncResult completes on
  a kazoo thread; `_bridge` turns it into an asyncio future settled through
  `loop.call_soon_threadsafe`, translating kazoo exceptions on the way;
- watch callbacks and session-state changes are forwarded the same way, so
  user callbacks always run on the event loop;
- blocking kazoo calls run in the default executor (start), or in a daemon thread of
  their own (stop and close: `close` waits for them at most `close_timeout_s`, so a stop
  never waits forever on an unreachable or paused server, and a thread still waiting
  on one never keeps the process alive).

Reads (get/exists/children) are retried a few times on connection loss while
the session lives; writes are not (a lost reply leaves the outcome unknown, so
the caller must re-read: every writer above the store does CAS re-reads anyway).
"""
from __future__ import annotations

import asyncio
import logging
import threading

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    InvalidACLError,
    KazooException,
    NoAuthError,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from kazoo.security import CREATOR_ALL_ACL
from kazoo.protocol.states import EventType as KazooEventType
from kazoo.retry import KazooRetry

from bk.errors import (
    MetadataExistsError,
    MetadataNotEmptyError,
    MetadataNotFoundError,
    MetadataStoreError,
    MetadataVersionError,
)
from bk.meta.store import (
    DEFAULT_ROOT,
    EventType,
    MetadataStore,
    SessionListener,
    SessionState,
    WatchEvent,
    Watcher,
    check_data,
    validate_path,
)

log = logging.getLogger(__name__)

_EVENT_TYPES = {
    KazooEventType.CREATED: EventType.CREATED,
    KazooEventType.DELETED: EventType.DELETED,
    KazooEventType.CHANGED: EventType.CHANGED,
    KazooEventType.CHILD: EventType.CHILD,
}
_READ_RETRIES = 4


def translate_error(exc: BaseException, op: str, path: str) -> BaseException:
    """kazoo exception -> bk.errors exception (kazoo never leaks above meta)."""
    if isinstance(exc, NoNodeError):
        return MetadataNotFoundError(f"no such znode: {path} ({op})")
    if isinstance(exc, NodeExistsError):
        return MetadataExistsError(f"znode {path} already exists")
    if isinstance(exc, BadVersionError):
        return MetadataVersionError(f"version conflict on {path} ({op})")
    if isinstance(exc, NotEmptyError):
        return MetadataNotEmptyError(f"cannot delete {path}: it has children")
    if isinstance(exc, NoChildrenForEphemeralsError):
        return MetadataStoreError(f"cannot {op} {path}: parent is ephemeral")
    if isinstance(exc, (NoAuthError, InvalidACLError)):
        return MetadataStoreError(f"ZooKeeper refused {op} {path}: not authorized (the znode's ACL needs the"
                                  " digest credentials of zk_digest_auth_path)")
    if isinstance(exc, ConnectionLoss):
        err = MetadataStoreError(f"ZooKeeper connection lost during {op} {path}")
        err.connection_loss = True  # reads may retry; a write's outcome is unknown
        return err
    if isinstance(exc, KazooException):
        return MetadataStoreError(f"ZooKeeper {op} {path} failed: {type(exc).__name__} {exc}".rstrip())
    if isinstance(exc, (TypeError, ValueError)):
        return MetadataStoreError(f"ZooKeeper {op} {path}: bad argument: {exc}")
    return exc


class ZooKeeperStore(MetadataStore):
    """One ZooKeeper session (a KazooClient). Open with `await ZooKeeperStore.connect(...)`
    and use it from the event loop that opened it: results and watch events are
    delivered to that loop."""

    def __init__(
        self,
        hosts: str,
        *,
        root: str = DEFAULT_ROOT,
        session_timeout_s: float = 10.0,
        connect_timeout_s: float = 15.0,
        zk_digest_auth: str | None = None,
        zk_enable_security: bool = False,
        close_timeout_s: float = 5.0,
    ):
        """`zk_digest_auth` "user:password" authenticates the session (ZooKeeper's digest scheme);
        `zk_enable_security` (BookKeeper's zkEnableSecurity) gives every znode this session creates
        the ACL CREATOR_ALL: only sessions with the same credentials may read or change it."""
        if zk_enable_security and not zk_digest_auth:
            raise MetadataStoreError("zk_enable_security needs digest credentials (zk_digest_auth_path)")
        if zk_digest_auth is not None and ":" not in zk_digest_auth:
            raise MetadataStoreError("ZooKeeper digest credentials must read user:password")
        self.zk_digest_auth = zk_digest_auth
        self.zk_enable_security = zk_enable_security
        self.hosts = hosts
        self.ledgers_root = validate_path(root)
        self.session_timeout_s = session_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.close_timeout_s = close_timeout_s
        self._client: KazooClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._listeners: list[SessionListener] = []
        # (kind, path, watcher) -> kazoo-side wrapper, so one watcher registered twice
        # on a path fires once (kazoo keeps watchers in sets), like the memory store.
        self._wrappers: dict[tuple[str, str, Watcher], object] = {}

    @classmethod
    async def connect(cls, hosts: str, **kwargs) -> "ZooKeeperStore":
        store = cls(hosts, **kwargs)
        await store.start()
        return store

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._client = KazooClient(
            hosts=self.hosts,
            timeout=self.session_timeout_s,
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=2.0),
            logger=logging.getLogger("bk.meta.kazoo"),
            auth_data=[("digest", self.zk_digest_auth)] if self.zk_digest_auth else None,
            default_acl=CREATOR_ALL_ACL if self.zk_enable_security else None,
        )
        self._client.add_listener(self._on_kazoo_state)
        try:
            await self._loop.run_in_executor(None, self._client.start, self.connect_timeout_s)
        except Exception as e:
            client, self._client = self._client, None
            await self._loop.run_in_executor(None, _stop_and_close, client)
            raise MetadataStoreError(
                f"cannot connect to ZooKeeper at {self.hosts} within {self.connect_timeout_s:g} s: {e}"
            ) from None

    @property
    def session_id(self) -> int:
        if self._client is None or self._client.client_id is None:
            return 0
        return self._client.client_id[0]

    @property
    def closed(self) -> bool:
        return self._closing

    # ------------------------------------------------------------------ the bridge
    def _require_client(self) -> KazooClient:
        if self._client is None or self._closing:
            raise MetadataStoreError("metadata store session is closed")
        return self._client

    def _bridge(self, start, op: str, path: str) -> asyncio.Future:
        """Run `start()` (a kazoo *_async call) and return a loop future for its result."""
        loop = self._loop
        fut = loop.create_future()
        try:
            async_result = start()
        except Exception as e:  # argument errors are raised synchronously by kazoo
            fut.set_exception(translate_error(e, op, path))
            return fut

        def settle(ok: bool, value) -> None:  # on the loop
            if fut.done():
                return
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(translate_error(value, op, path))

        def on_complete(result) -> None:  # on a kazoo thread
            try:
                outcome = (True, result.get_nowait())
            except BaseException as e:  # noqa: BLE001 - forwarded, not swallowed
                outcome = (False, e)
            try:
                loop.call_soon_threadsafe(settle, *outcome)
            except RuntimeError:
                pass  # the loop is closed: nobody waits any more

        async_result.rawlink(on_complete)
        return fut

    def _wrap_watch(self, kind: str, path: str, watcher: Watcher):
        """(kazoo-side wrapper, newly made?) forwarding one watch event to the loop."""
        key = (kind, path, watcher)
        wrapper = self._wrappers.get(key)
        if wrapper is not None:
            return wrapper, False
        loop = self._loop

        def deliver(event: WatchEvent) -> None:  # on the loop
            if self._wrappers.get(key) is wrapper:
                del self._wrappers[key]
            if not self._closing:
                watcher(event)

        def wrapper(kazoo_event) -> None:  # on kazoo's event thread
            etype = _EVENT_TYPES.get(kazoo_event.type, EventType.DISCONNECTED)
            try:
                loop.call_soon_threadsafe(deliver, WatchEvent(etype, path))
            except RuntimeError:
                pass

        self._wrappers[key] = wrapper
        return wrapper, True

    async def _read(self, op: str, kind: str, path: str, watch: Watcher | None, call):
        """A read, retried on connection loss; `call(kazoo_watcher)` starts the kazoo op.
        kazoo (and the server) keep a watch only when the read succeeds, so a wrapper
        made for a failed read is forgotten again."""
        wrapper, made = self._wrap_watch(kind, path, watch) if watch else (None, False)
        try:
            for attempt in range(_READ_RETRIES):
                try:
                    return await self._bridge(lambda: call(wrapper), op, path)
                except MetadataStoreError as e:
                    if not getattr(e, "connection_loss", False) or attempt == _READ_RETRIES - 1:
                        raise
                    await asyncio.sleep(0.1 * 2**attempt)
        except BaseException:
            if made and self._wrappers.get((kind, path, watch)) is wrapper:
                del self._wrappers[(kind, path, watch)]
            raise

    # ------------------------------------------------------------------ reads
    async def get(self, path: str, watch: Watcher | None = None) -> tuple[bytes, int]:
        validate_path(path)
        client = self._require_client()
        data, stat = await self._read("get", "data", path, watch, lambda w: client.get_async(path, watch=w))
        return data, stat.version

    async def get_with_owner(self, path: str) -> tuple[bytes, int, int]:
        validate_path(path)
        client = self._require_client()
        data, stat = await self._read("get", "data", path, None, lambda w: client.get_async(path))
        return data, stat.version, stat.ephemeralOwner

    async def exists(self, path: str, watch: Watcher | None = None) -> int | None:
        validate_path(path)
        client = self._require_client()
        stat = await self._read("exists", "data", path, watch, lambda w: client.exists_async(path, watch=w))
        return None if stat is None else stat.version

    async def children(self, path: str, watch: Watcher | None = None) -> list[str]:
        validate_path(path)
        client = self._require_client()
        names = await self._read(
            "children", "child", path, watch, lambda w: client.get_children_async(path, watch=w)
        )
        return sorted(names)

    # ------------------------------------------------------------------ writes
    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        make_parents: bool = False,
    ) -> str:
        validate_path(path)
        data = check_data(data)
        client = self._require_client()
        return await self._bridge(
            lambda: client.create_async(
                path, data, ephemeral=ephemeral, sequence=sequential, makepath=make_parents
            ),
            "create",
            path,
        )

    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        validate_path(path)
        data = check_data(data)
        client = self._require_client()
        stat = await self._bridge(lambda: client.set_async(path, data, version), "set", path)
        return stat.version

    async def _delete_node(self, path: str, version: int) -> None:
        client = self._require_client()
        await self._bridge(lambda: client.delete_async(path, version), "delete", path)

    # ------------------------------------------------------------------ session
    def _on_kazoo_state(self, state) -> None:  # on a kazoo thread; must not block
        if self._closing:
            return
        mapped = {
            KazooState.CONNECTED: SessionState.CONNECTED,
            KazooState.SUSPENDED: SessionState.SUSPENDED,
            KazooState.LOST: SessionState.EXPIRED,
        }.get(state)
        if mapped is None or self._loop is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._notify, mapped)
        except RuntimeError:
            pass

    def _notify(self, state: SessionState) -> None:
        if self._closing:
            return
        if state is SessionState.EXPIRED:
            log.warning("ZooKeeper session expired (%s)", self.hosts)
        for listener in list(self._listeners):
            listener(state)

    def add_session_listener(self, listener: SessionListener) -> None:
        self._listeners.append(listener)

    def remove_session_listener(self, listener: SessionListener) -> None:
        self._listeners = [fn for fn in self._listeners if fn is not listener]

    async def close(self) -> None:
        """End the session. kazoo's stop waits for its connection thread, which takes seconds
        when the server is down or paused: it runs in a daemon thread and is waited for at most
        `close_timeout_s`. A close that runs out returns anyway (logged); the server then ends
        the session, and its ephemeral nodes, by the session timeout. Requests still queued
        fail as the session closes (kazoo answers them ConnectionClosedError)."""
        if self._closing or self._client is None:
            self._closing = True
            return
        self._closing = True
        client, self._client = self._client, None
        self._wrappers.clear()
        loop = self._loop
        done = loop.create_future()

        def finished() -> None:  # on the loop
            if not done.done():
                done.set_result(None)

        def run() -> None:  # on its own daemon thread
            try:
                _stop_and_close(client)
            except Exception as e:  # noqa: BLE001 - the session ends either way
                log.warning("closing the ZooKeeper session to %s: %s", self.hosts, e)
            finally:
                try:
                    loop.call_soon_threadsafe(finished)
                except RuntimeError:
                    pass  # the loop is closed: nobody waits any more

        threading.Thread(target=run, name="kazoo-close", daemon=True).start()
        try:
            async with asyncio.timeout(self.close_timeout_s):
                await asyncio.shield(done)
        except asyncio.TimeoutError:
            log.warning("closing the ZooKeeper session to %s did not finish within %.1f s: left to the"
                        " server's session timeout", self.hosts, self.close_timeout_s)

    async def expire_session(self) -> None:
        """Expire this session the way ZooKeeper's own tests do: connect a second
        client with the same session id and password, then close it. The server
        ends the session; kazoo reports LOST and then connects a new session."""
        client = self._require_client()
        old_id = self.session_id
        states: asyncio.Queue = asyncio.Queue()
        listener = states.put_nowait
        self.add_session_listener(listener)
        try:
            for _ in range(5):
                session_id, password = client.client_id
                await self._loop.run_in_executor(None, _close_session, self.hosts, session_id, password)
                try:
                    async with asyncio.timeout(self.session_timeout_s * 2):
                        await self._until_new_session(states, old_id)
                    return
                except asyncio.TimeoutError:
                    continue  # the original client took its session back first; again
            raise MetadataStoreError(f"could not expire ZooKeeper session {old_id:#x}")
        finally:
            self.remove_session_listener(listener)

    async def _until_new_session(self, states: asyncio.Queue, old_id: int) -> None:
        expired = False
        while True:
            state = await states.get()
            if state is SessionState.EXPIRED:
                expired = True
            elif state is SessionState.CONNECTED and expired and self.session_id != old_id:
                return

    def __repr__(self) -> str:
        return f"ZooKeeperStore({self.hosts!r}, session={self.session_id:#x}, root={self.ledgers_root!r})"


def _stop_and_close(client: KazooClient) -> None:
    try:
        client.stop()
    finally:
        client.close()


def _close_session(hosts: str, session_id: int, password: bytes) -> None:
    other = KazooClient(hosts=hosts, client_id=(session_id, password), connection_retry=None)
    try:
        other.start(timeout=10)
    except Exception:  # noqa: BLE001 - the session may already be gone
        pass
    finally:
        _stop_and_close(other)
