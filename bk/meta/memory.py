"""InMemoryStore: ZooKeeper's semantics in one process, for tests and embedding.

A `MemoryTree` is the shared data (what a ZooKeeper ensemble holds); each
`InMemoryStore` attached to it is one session. Named trees are process-wide:
`InMemoryStore.shared("name")` (or `open_store("mem://name/ledgers")`) gives a
new session on the same tree each time, so several components of one process
(bookies, clients, the auditor) see each other's nodes, ephemerals and watches.

The tree is guarded by one lock, so sessions may live on different event loops
or threads. Operations complete synchronously inside the coroutine; watch
events are queued with `call_soon_threadsafe` to the loop that registered the
watch, so a watcher never runs inside the operation that fired it (as with
ZooKeeper, where events arrive from the server).
"""
from __future__ import annotations

import asyncio
import itertools
import threading

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
    parent_of,
    validate_path,
)


class _Node:
    __slots__ = ("data", "version", "cversion", "owner", "children")

    def __init__(self, data: bytes, owner: int):
        self.data = data
        self.version = 0
        self.cversion = 0  # children ever created here: the sequence counter
        self.owner = owner  # session id of an ephemeral node, 0 if persistent
        self.children: dict[str, _Node] = {}


# a registered watch: (session id, watcher) -> loop to deliver on
_WatchSet = dict


class MemoryTree:
    """The shared tree of nodes, sessions and pending watches."""

    def __init__(self, name: str = ""):
        self.name = name
        self.lock = threading.RLock()
        self.root = _Node(b"", 0)
        self._session_ids = itertools.count(1)
        self.ephemerals: dict[int, set[str]] = {}
        self.data_watches: dict[str, _WatchSet] = {}
        self.child_watches: dict[str, _WatchSet] = {}

    def new_session(self) -> int:
        with self.lock:
            sid = next(self._session_ids)
            self.ephemerals[sid] = set()
            return sid

    # -- lookups (lock held)
    def find(self, path: str) -> _Node | None:
        node = self.root
        if path == "/":
            return node
        for part in path[1:].split("/"):
            node = node.children.get(part)
            if node is None:
                return None
        return node

    def require(self, path: str) -> _Node:
        node = self.find(path)
        if node is None:
            raise MetadataNotFoundError(f"no such znode: {path}")
        return node

    # -- watch bookkeeping (lock held); returns deliveries to schedule after unlock
    @staticmethod
    def _take(table: dict[str, _WatchSet], path: str, etype: EventType, out: list) -> None:
        watches = table.pop(path, None)
        if watches:
            event = WatchEvent(etype, path)
            out.extend((loop, watcher, event) for (_, watcher), loop in watches.items())

    def fire_created(self, path: str, out: list) -> None:
        self._take(self.data_watches, path, EventType.CREATED, out)
        self._take(self.child_watches, parent_of(path), EventType.CHILD, out)

    def fire_deleted(self, path: str, out: list) -> None:
        self._take(self.data_watches, path, EventType.DELETED, out)
        self._take(self.child_watches, path, EventType.DELETED, out)
        self._take(self.child_watches, parent_of(path), EventType.CHILD, out)

    def fire_changed(self, path: str, out: list) -> None:
        self._take(self.data_watches, path, EventType.CHANGED, out)

    def add_watch(self, table: dict[str, _WatchSet], path: str, sid: int, watcher: Watcher, loop) -> None:
        table.setdefault(path, {})[(sid, watcher)] = loop

    def drop_session_watches(self, sid: int, out: list | None) -> None:
        """Remove a session's pending watches; with `out`, report them as DISCONNECTED."""
        for table in (self.data_watches, self.child_watches):
            for path in list(table):
                watches = table[path]
                for key in [k for k in watches if k[0] == sid]:
                    loop = watches.pop(key)
                    if out is not None:
                        out.append((loop, key[1], WatchEvent(EventType.DISCONNECTED, path)))
                if not watches:
                    del table[path]

    # -- mutations (lock held)
    def delete_node(self, path: str, version: int, out: list) -> None:
        node = self.require(path)
        if version != -1 and node.version != version:
            raise MetadataVersionError(f"version conflict deleting {path}: expected {version}, is {node.version}")
        if node.children:
            raise MetadataNotEmptyError(f"cannot delete {path}: it has children")
        parent = self.find(parent_of(path))
        del parent.children[path.rsplit("/", 1)[1]]
        if node.owner:
            self.ephemerals.get(node.owner, set()).discard(path)
        self.fire_deleted(path, out)

    def end_session(self, sid: int, out: list, *, report_watches: bool) -> None:
        # Deepest first is not needed (ephemerals have no children), but sorted
        # order makes event order deterministic.
        for path in sorted(self.ephemerals.pop(sid, set())):
            if self.find(path) is not None:
                self.delete_node(path, -1, out)
        self.drop_session_watches(sid, out if report_watches else None)


def deliver(deliveries: list) -> None:
    """Schedule watch callbacks on their loops (called with the tree lock released)."""
    for loop, watcher, event in deliveries:
        try:
            loop.call_soon_threadsafe(watcher, event)
        except RuntimeError:
            pass  # that loop is closed: its session is gone with it


_TREES: dict[str, MemoryTree] = {}
_TREES_LOCK = threading.Lock()


class InMemoryStore(MetadataStore):
    """One session on a MemoryTree (a private tree when none is given)."""

    def __init__(self, tree: MemoryTree | None = None, *, root: str = DEFAULT_ROOT):
        self.tree = tree if tree is not None else MemoryTree()
        self.ledgers_root = validate_path(root)
        self._sid = self.tree.new_session()
        self._closed = False
        self._listeners: list[tuple[SessionListener, asyncio.AbstractEventLoop | None]] = []

    @classmethod
    def shared(cls, name: str, *, root: str = DEFAULT_ROOT) -> "InMemoryStore":
        """A new session on the process-wide tree called `name` (created on first use)."""
        with _TREES_LOCK:
            tree = _TREES.get(name)
            if tree is None:
                tree = _TREES[name] = MemoryTree(name)
        return cls(tree, root=root)

    @staticmethod
    def drop_shared(name: str) -> None:
        """Forget a named tree (sessions attached to it keep working on their copy)."""
        with _TREES_LOCK:
            _TREES.pop(name, None)

    @property
    def session_id(self) -> int:
        return self._sid

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise MetadataStoreError("metadata store session is closed")

    # ------------------------------------------------------------------ reads
    async def get(self, path: str, watch: Watcher | None = None) -> tuple[bytes, int]:
        validate_path(path)
        self._check_open()
        with self.tree.lock:
            node = self.tree.require(path)
            if watch is not None:
                self.tree.add_watch(self.tree.data_watches, path, self._sid, watch, asyncio.get_running_loop())
            return node.data, node.version

    async def get_with_owner(self, path: str) -> tuple[bytes, int, int]:
        validate_path(path)
        self._check_open()
        with self.tree.lock:
            node = self.tree.require(path)
            return node.data, node.version, node.owner

    async def exists(self, path: str, watch: Watcher | None = None) -> int | None:
        validate_path(path)
        self._check_open()
        with self.tree.lock:
            node = self.tree.find(path)
            if watch is not None:
                self.tree.add_watch(self.tree.data_watches, path, self._sid, watch, asyncio.get_running_loop())
            return None if node is None else node.version

    async def children(self, path: str, watch: Watcher | None = None) -> list[str]:
        validate_path(path)
        self._check_open()
        with self.tree.lock:
            node = self.tree.require(path)
            if watch is not None:
                self.tree.add_watch(self.tree.child_watches, path, self._sid, watch, asyncio.get_running_loop())
            return sorted(node.children)

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
        if path == "/":
            raise MetadataExistsError("znode / already exists")
        data = check_data(data)
        self._check_open()
        out: list = []
        try:
            with self.tree.lock:
                parent_path = parent_of(path)
                parent = self.tree.find(parent_path)
                if parent is None:
                    if not make_parents:
                        raise MetadataNotFoundError(f"cannot create {path}: parent {parent_path} does not exist")
                    parent = self._make_parents(parent_path, out)
                if parent.owner:
                    raise MetadataStoreError(f"cannot create {path}: parent {parent_path} is ephemeral")
                if sequential:
                    path = f"{path}{parent.cversion:010d}"
                name = path.rsplit("/", 1)[1]
                if name in parent.children:
                    raise MetadataExistsError(f"znode {path} already exists")
                parent.children[name] = _Node(data, self._sid if ephemeral else 0)
                parent.cversion += 1
                if ephemeral:
                    self.tree.ephemerals[self._sid].add(path)
                self.tree.fire_created(path, out)
                return path
        finally:
            deliver(out)

    def _make_parents(self, path: str, out: list) -> _Node:
        node = self.tree.root
        walked = ""
        for part in path[1:].split("/"):
            walked += "/" + part
            child = node.children.get(part)
            if child is None:
                if node.owner:
                    raise MetadataStoreError(f"cannot create {walked}: parent is ephemeral")
                child = node.children[part] = _Node(b"", 0)
                node.cversion += 1
                self.tree.fire_created(walked, out)
            node = child
        return node

    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        validate_path(path)
        data = check_data(data)
        self._check_open()
        out: list = []
        try:
            with self.tree.lock:
                node = self.tree.require(path)
                if version != -1 and node.version != version:
                    raise MetadataVersionError(
                        f"version conflict setting {path}: expected {version}, is {node.version}"
                    )
                node.data = data
                node.version += 1
                self.tree.fire_changed(path, out)
                return node.version
        finally:
            deliver(out)

    async def _delete_node(self, path: str, version: int) -> None:
        self._check_open()
        out: list = []
        try:
            with self.tree.lock:
                self.tree.delete_node(path, version, out)
        finally:
            deliver(out)

    # ------------------------------------------------------------------ session
    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        out: list = []
        with self.tree.lock:
            self.tree.end_session(self._sid, out, report_watches=False)
        deliver(out)

    async def expire_session(self) -> None:
        self._check_open()
        out: list = []
        with self.tree.lock:
            self.tree.end_session(self._sid, out, report_watches=True)
            self._sid = self.tree.new_session()
        deliver(out)
        self._notify(SessionState.EXPIRED)
        self._notify(SessionState.CONNECTED)
        await asyncio.sleep(0)  # let the DISCONNECTED/EXPIRED callbacks run first

    def add_session_listener(self, listener: SessionListener) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        self._listeners.append((listener, loop))

    def remove_session_listener(self, listener: SessionListener) -> None:
        self._listeners = [(fn, loop) for fn, loop in self._listeners if fn is not listener]

    def _notify(self, state: SessionState) -> None:
        for listener, loop in list(self._listeners):
            loop = loop or asyncio.get_running_loop()
            try:
                loop.call_soon_threadsafe(listener, state)
            except RuntimeError:
                pass

    def __repr__(self) -> str:
        return f"InMemoryStore(tree={self.tree.name!r}, session={self._sid}, root={self.ledgers_root!r})"
