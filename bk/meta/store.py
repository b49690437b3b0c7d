"""The metadata store interface: ZooKeeper's data model behind async methods.

Everything above the store (cluster init, LedgerManager, RegistrationManager,
cookies, under-replication) is written once against `MetadataStore` and runs
on both implementations: `ZooKeeperStore` (kazoo) and `InMemoryStore`.

Semantics (both implementations, checked by the same tests):
- A node has data (bytes) and a version: 0 after create, +1 per `set`.
  `set`/`delete` with `version >= 0` are compare-and-set: a different current
  version raises `MetadataVersionError`; `-1` means "any version".
- Ephemeral nodes belong to the session (one store object = one session) and
  vanish when it is closed or expires; they cannot have children.
- Sequential creates append a 10-digit zero-padded counter kept by the parent:
  the number of children ever created under it (ZooKeeper 3.8 counts creates
  of any kind, not deletes), so numbers only grow and are never reused.
- Watches are one-shot. `get`/`exists` leave a data watch (CREATED, CHANGED,
  DELETED), `children` a child watch (CHILD, or DELETED for the node itself).
  A watch also fires once with DISCONNECTED when the connection or session is
  lost (the store can no longer promise to report the next change): the
  watcher re-reads and re-arms. Watchers run on the event loop thread of the
  coroutine that registered them, never inside the operation that triggered them.
- Errors: NoNode -> `MetadataNotFoundError`, NodeExists -> `MetadataExistsError`,
  NotEmpty -> `MetadataNotEmptyError`, BadVersion -> `MetadataVersionError`,
  anything else (connection loss, closed store, bad path) -> `MetadataStoreError`.
- `children` returns names sorted (ZooKeeper's order is unspecified).
"""
from __future__ import annotations

import abc
import asyncio
import enum
import urllib.parse
from dataclasses import dataclass
from typing import Callable

from bk.errors import (
    MetadataExistsError,
    MetadataNotEmptyError,
    MetadataNotFoundError,
    MetadataStoreError,
)

DEFAULT_ROOT = "/ledgers"
DEFAULT_ZK_PORT = 2181
# ZooKeeper refuses packets above jute.maxbuffer (1 MiB); keep data clearly below.
MAX_DATA_BYTES = 1_000_000


class EventType(enum.Enum):
    CREATED = "created"
    DELETED = "deleted"
    CHANGED = "changed"
    CHILD = "child"
    DISCONNECTED = "disconnected"  # the watch was dropped: re-read and re-arm


@dataclass(frozen=True)
class WatchEvent:
    type: EventType
    path: str


class SessionState(enum.Enum):
    CONNECTED = "connected"  # (re)connected; after EXPIRED this is a new session
    SUSPENDED = "suspended"  # connection lost, session may still be alive
    EXPIRED = "expired"  # session gone: its ephemeral nodes are deleted


Watcher = Callable[[WatchEvent], None]
SessionListener = Callable[[SessionState], None]


def validate_path(path: str) -> str:
    """ZooKeeper path rules: absolute, no empty/./.. components, no trailing '/'."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise MetadataStoreError(f"invalid znode path {path!r}: must be an absolute string path")
    if path == "/":
        return path
    if path.endswith("/"):
        raise MetadataStoreError(f"invalid znode path {path!r}: trailing '/'")
    for part in path[1:].split("/"):
        if part in ("", ".", "..") or "\x00" in part:
            raise MetadataStoreError(f"invalid znode path {path!r}: bad component {part!r}")
    return path


def parent_of(path: str) -> str:
    head = path.rsplit("/", 1)[0]
    return head or "/"


def join_path(*parts: str) -> str:
    """Join znode path parts: join_path('/ledgers', 'available') -> '/ledgers/available'."""
    out = "/".join(p.strip("/") for p in parts if p.strip("/"))
    return "/" + out


def check_data(data) -> bytes:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise MetadataStoreError(f"znode data must be bytes, not {type(data).__name__}")
    data = bytes(data)
    if len(data) > MAX_DATA_BYTES:
        raise MetadataStoreError(f"znode data of {len(data)} bytes exceeds {MAX_DATA_BYTES} bytes")
    return data


class MetadataStore(abc.ABC):
    """One session on a ZooKeeper-like tree. Create with `open_store(uri)`."""

    #: the ledgers root of the metadata service URI this store was opened with
    ledgers_root: str = DEFAULT_ROOT

    # ------------------------------------------------------------------ primitives
    @abc.abstractmethod
    async def get(self, path: str, watch: Watcher | None = None) -> tuple[bytes, int]:
        """(data, version); raises MetadataNotFoundError."""

    @abc.abstractmethod
    async def get_with_owner(self, path: str) -> tuple[bytes, int, int]:
        """(data, version, session id of the ephemeral node's owner, 0 for a persistent
        node); raises MetadataNotFoundError. How a session finds its own ephemeral node
        whose create reply it never got (LedgerUnderreplicationManager's lost locks)."""

    @abc.abstractmethod
    async def exists(self, path: str, watch: Watcher | None = None) -> int | None:
        """The version, or None. A watch is left even when the node is missing."""

    @abc.abstractmethod
    async def children(self, path: str, watch: Watcher | None = None) -> list[str]:
        """Sorted child names; raises MetadataNotFoundError."""

    @abc.abstractmethod
    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        make_parents: bool = False,
    ) -> str:
        """Create a node; returns its path (with the sequence suffix if sequential)."""

    @abc.abstractmethod
    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        """Replace the data if the version matches; returns the new version."""

    @abc.abstractmethod
    async def _delete_node(self, path: str, version: int) -> None:
        """Delete one childless node (version-checked unless -1)."""

    @property
    @abc.abstractmethod
    def session_id(self) -> int:
        """The current session's id (changes after an expiry)."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """True once close() began: no call succeeds any more."""

    @abc.abstractmethod
    async def close(self) -> None:
        """End the session: its ephemeral nodes are deleted, its watches dropped."""

    @abc.abstractmethod
    async def expire_session(self) -> None:
        """Test aid: make the server expire this session (ephemerals vanish, watches
        fire DISCONNECTED, listeners see EXPIRED) and return once a new session is up."""

    @abc.abstractmethod
    def add_session_listener(self, listener: SessionListener) -> None:
        """Call `listener(SessionState)` on the loop on every session state change."""

    @abc.abstractmethod
    def remove_session_listener(self, listener: SessionListener) -> None:
        ...

    # ------------------------------------------------------------------ helpers
    async def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        """Delete a node; `recursive` removes its subtree first (children unversioned).

        Raises MetadataNotFoundError if `path` is missing, MetadataNotEmptyError if it
        has children and `recursive` is false (or children keep appearing)."""
        validate_path(path)
        if path == "/":
            raise MetadataStoreError("refusing to delete the root znode '/'")
        if not recursive:
            await self._delete_node(path, version)
            return
        for _ in range(10):
            await self._delete_children(path)
            try:
                await self._delete_node(path, version)
                return
            except MetadataNotEmptyError:
                continue  # a child was created meanwhile: go again
        raise MetadataNotEmptyError(f"cannot delete {path}: children keep being created")

    async def _delete_children(self, path: str) -> None:
        try:
            names = await self.children(path)
        except MetadataNotFoundError:
            return
        for name in names:
            child = join_path(path, name)
            await self._delete_children(child)
            try:
                await self._delete_node(child, -1)
            except MetadataNotFoundError:
                pass  # removed concurrently (or an ephemeral whose session ended)

    async def ensure_path(self, path: str) -> None:
        """Create `path` and its missing parents as empty persistent nodes."""
        validate_path(path)
        if path == "/" or await self.exists(path) is not None:
            return
        try:
            await self.create(path, b"", make_parents=True)
        except MetadataExistsError:
            pass

    async def get_watched(self, path: str) -> tuple[bytes, int, asyncio.Future]:
        """(data, version, future of the next WatchEvent on this node)."""
        watcher, fut = _future_watcher()
        data, version = await self.get(path, watcher)
        return data, version, fut

    async def exists_watched(self, path: str) -> tuple[int | None, asyncio.Future]:
        watcher, fut = _future_watcher()
        version = await self.exists(path, watcher)
        return version, fut

    async def children_watched(self, path: str) -> tuple[list[str], asyncio.Future]:
        watcher, fut = _future_watcher()
        names = await self.children(path, watcher)
        return names, fut

    async def __aenter__(self) -> "MetadataStore":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


def _future_watcher() -> tuple[Watcher, asyncio.Future]:
    fut = asyncio.get_running_loop().create_future()

    def watcher(event: WatchEvent) -> None:
        if not fut.done():
            fut.set_result(event)

    return watcher, fut


# ---------------------------------------------------------------------- URIs
@dataclass(frozen=True)
class MetadataServiceUri:
    """`zk://h1:2181,h2:2181/ledgers` or `mem://name/ledgers`."""

    scheme: str  # "zk" or "mem"
    hosts: str  # "h1:2181,h2:2181" for zk; the tree name for mem
    root: str  # ledgers root path, default /ledgers

    def __str__(self) -> str:
        return f"{self.scheme}://{self.hosts}{self.root}"


_ZK_SCHEMES = ("zk", "zk+hierarchical")


def parse_metadata_uri(uri: str) -> MetadataServiceUri:
    if not isinstance(uri, str) or "://" not in uri:
        raise MetadataStoreError(f"bad metadata service URI {uri!r}: expected zk://host:port/ledgers")
    scheme, rest = uri.split("://", 1)
    scheme = scheme.lower()
    netloc, slash, path = rest.partition("/")
    root = "/" + path if slash else ""
    root = root.rstrip("/") or DEFAULT_ROOT
    try:
        validate_path(root)
    except MetadataStoreError as e:
        raise MetadataStoreError(f"bad metadata service URI {uri!r}: {e}") from None
    if scheme in _ZK_SCHEMES:
        hosts = []
        # BookKeeper separates hosts with ';' in URIs; ZooKeeper connect strings use ','.
        for hostport in netloc.replace(";", ",").split(","):
            hostport = hostport.strip()
            if not hostport:
                continue
            parsed = urllib.parse.urlsplit("//" + hostport)
            try:
                port = parsed.port or DEFAULT_ZK_PORT
            except ValueError:
                raise MetadataStoreError(f"bad metadata service URI {uri!r}: bad port in {hostport!r}") from None
            if not parsed.hostname:
                raise MetadataStoreError(f"bad metadata service URI {uri!r}: no host in {hostport!r}")
            host = parsed.hostname
            hosts.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        if not hosts:
            raise MetadataStoreError(f"bad metadata service URI {uri!r}: no ZooKeeper host")
        return MetadataServiceUri("zk", ",".join(hosts), root)
    if scheme == "mem":
        if not netloc:
            raise MetadataStoreError(f"bad metadata service URI {uri!r}: mem://<name>/ledgers needs a name")
        return MetadataServiceUri("mem", netloc, root)
    raise MetadataStoreError(f"bad metadata service URI {uri!r}: unknown scheme {scheme!r} (zk or mem)")
