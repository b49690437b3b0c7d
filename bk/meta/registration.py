"""RegistrationManager: live bookies as ephemeral znodes under `available/`.

A writable bookie is `<root>/available/<bookie_id>`, a read-only one
`<root>/available/readonly/<bookie_id>`; both are ephemeral (they vanish with
the bookie's session) and hold a binary `BookieServiceInfoFormat`.

- Switching mode creates the new node before deleting the old one, so a live
  bookie is always listed somewhere.
- A node left by the bookie's previous session (restart faster than the session
  timeout) is waited out, up to `stale_registration_timeout_s`; a node that
  stays means another live process uses the same bookie id: refused.
- After a session expiry the manager registers again in the same mode (its
  nodes died with the old session), like BookKeeper's bookie does.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from bk.errors import MetadataExistsError, MetadataNotFoundError, MetadataStoreError
from bk.meta import formats
from bk.meta.cluster import check_bookie_id, paths_for
from bk.meta.store import MetadataStore, SessionState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Endpoint:
    id: str
    host: str
    port: int
    protocol: str
    auth: tuple[str, ...] = ()
    extensions: tuple[str, ...] = ()


@dataclass(frozen=True)
class BookieServiceInfo:
    """Where and how to reach a bookie (BookKeeper's BookieServiceInfo)."""

    endpoints: tuple[Endpoint, ...] = ()
    properties: tuple[tuple[str, str], ...] = field(default=())  # sorted; a dict is accepted

    def __post_init__(self) -> None:
        props = self.properties
        if isinstance(props, Mapping):
            props = props.items()
        object.__setattr__(self, "properties", tuple(sorted((str(k), str(v)) for k, v in props)))
        object.__setattr__(self, "endpoints", tuple(self.endpoints))

    def http_url(self) -> str | None:
        """The base URL of the bookie's HTTP admin server (its `http` endpoint), or None."""
        for ep in self.endpoints:
            if ep.protocol == "http":
                return f"http://{ep.host}:{ep.port}"
        return None

    @classmethod
    def for_bookie(cls, bookie_id: str, properties: Mapping[str, str] | None = None) -> "BookieServiceInfo":
        """BookKeeper's legacy info: one `bookie-rpc` endpoint named `bookie` at host:port."""
        host, port = split_bookie_id(bookie_id)
        return cls((Endpoint("bookie", host, port, "bookie-rpc"),), properties or ())

    def serialize(self) -> bytes:
        msg = formats.BookieServiceInfoFormat()
        for ep in self.endpoints:
            out = msg.endpoints.add(id=ep.id, port=ep.port, host=ep.host, protocol=ep.protocol)
            out.auth.extend(ep.auth)
            out.extensions.extend(ep.extensions)
        for key, value in self.properties:
            msg.properties[key] = value
        return formats.to_binary(msg)

    @classmethod
    def deserialize(cls, data: bytes) -> "BookieServiceInfo":
        msg = formats.from_binary(formats.BookieServiceInfoFormat, data)
        return cls(
            tuple(
                Endpoint(e.id, e.host, e.port, e.protocol, tuple(e.auth), tuple(e.extensions)) for e in msg.endpoints
            ),
            dict(msg.properties),
        )


def split_bookie_id(bookie_id: str) -> tuple[str, int]:
    """`host:port` (or `[v6addr]:port`) -> (host, port)."""
    host, sep, port = bookie_id.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise MetadataStoreError(f"bookie id {bookie_id!r} is not host:port")
    return host.strip("[]"), int(port)


BookiesListener = Callable[[frozenset], None]


class RegistrationManager:
    def __init__(
        self,
        store: MetadataStore,
        root: str | None = None,
        *,
        stale_registration_timeout_s: float = 30.0,
        reregister_on_expiry: bool = True,
    ):
        self.store = store
        self.paths = paths_for(store, root)
        self.stale_registration_timeout_s = stale_registration_timeout_s
        self.reregister_on_expiry = reregister_on_expiry
        # bookie_id -> (readonly, service_info) of what this manager has registered
        self._registered: dict[str, tuple[bool, BookieServiceInfo]] = {}
        self._owned: set[str] = set()  # znodes created in the current session
        self._expired = False
        self._reregistering: asyncio.Task | None = None
        store.add_session_listener(self._on_session_state)

    def _path(self, bookie_id: str, readonly: bool) -> str:
        return self.paths.readonly_bookie(bookie_id) if readonly else self.paths.writable_bookie(bookie_id)

    # ------------------------------------------------------------------ register
    async def register(
        self, bookie_id: str, readonly: bool = False, service_info: BookieServiceInfo | None = None
    ) -> None:
        """Register (or switch the mode of) a live bookie in this store's session."""
        check_bookie_id(bookie_id)
        info = service_info or BookieServiceInfo.for_bookie(bookie_id)
        path, other = self._path(bookie_id, readonly), self._path(bookie_id, not readonly)
        await self._create_ephemeral(bookie_id, path, info.serialize())
        self._registered[bookie_id] = (readonly, info)
        if other in self._owned:
            try:
                await self.store.delete(other)
            except MetadataNotFoundError:
                pass
            self._owned.discard(other)

    async def _create_ephemeral(self, bookie_id: str, path: str, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.stale_registration_timeout_s
        while True:
            try:
                await self.store.create(path, data, ephemeral=True, make_parents=True)
                self._owned.add(path)
                return
            except MetadataExistsError:
                if path in self._owned:  # ours already: refresh the service info
                    await self.store.set(path, data)
                    return
            # Someone else's node: a previous session of this bookie, or a live twin.
            version, gone = await self.store.exists_watched(path)
            if version is None:
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise MetadataExistsError(
                    f"bookie {bookie_id} is already registered at {path} by another session that did not"
                    f" expire within {self.stale_registration_timeout_s:g} s (another bookie with the same id?)"
                )
            try:
                async with asyncio.timeout(remaining):
                    await gone
            except asyncio.TimeoutError:
                pass

    async def unregister(self, bookie_id: str) -> None:
        """Remove this bookie's registration (both modes); missing nodes are fine."""
        check_bookie_id(bookie_id)
        self._registered.pop(bookie_id, None)
        for readonly in (False, True):
            path = self._path(bookie_id, readonly)
            try:
                await self.store.delete(path)
            except MetadataNotFoundError:
                pass
            self._owned.discard(path)

    async def registration(self, bookie_id: str) -> str | None:
        """'writable', 'readonly' or None, as the cluster sees it now."""
        if await self.store.exists(self._path(bookie_id, False)) is not None:
            return "writable"
        if await self.store.exists(self._path(bookie_id, True)) is not None:
            return "readonly"
        return None

    async def get_service_info(self, bookie_id: str) -> BookieServiceInfo | None:
        for readonly in (False, True):
            try:
                data, _ = await self.store.get(self._path(bookie_id, readonly))
            except MetadataNotFoundError:
                continue
            return BookieServiceInfo.deserialize(data)
        return None

    # ------------------------------------------------------------------ listing
    async def writable_bookies(self) -> list[str]:
        return _writable(await self._children_or_empty(self.paths.available))

    async def readonly_bookies(self) -> list[str]:
        return await self._children_or_empty(self.paths.readonly)

    async def known_bookies(self) -> list[str]:
        """Every bookie that ever started in this cluster (has a cookie)."""
        return await self._children_or_empty(self.paths.cookies)

    async def _children_or_empty(self, path: str) -> list[str]:
        try:
            return await self.store.children(path)
        except MetadataNotFoundError:
            return []

    async def watch_writable_bookies(self, listener: BookiesListener) -> "BookiesWatch":
        return await BookiesWatch(self.store, self.paths.available, listener, _writable)._start()

    async def watch_readonly_bookies(self, listener: BookiesListener) -> "BookiesWatch":
        return await BookiesWatch(self.store, self.paths.readonly, listener, list)._start()

    # ------------------------------------------------------------------ session
    def _on_session_state(self, state: SessionState) -> None:
        if state is SessionState.EXPIRED:
            self._owned.clear()  # those nodes died with the session
            self._expired = True
        elif state is SessionState.CONNECTED and self._expired:
            self._expired = False
            if self.reregister_on_expiry and self._registered:
                self._reregistering = asyncio.get_running_loop().create_task(self._reregister())

    async def _reregister(self) -> None:
        for bookie_id, (readonly, info) in list(self._registered.items()):
            try:
                await self.register(bookie_id, readonly, info)
                log.warning("re-registered bookie %s after session expiry", bookie_id)
            except Exception:
                log.exception("could not re-register bookie %s after session expiry", bookie_id)

    async def close(self) -> None:
        self.store.remove_session_listener(self._on_session_state)
        if self._reregistering is not None:
            self._reregistering.cancel()


def _writable(names: Iterable[str]) -> list[str]:
    return [n for n in names if n != "readonly"]


class BookiesWatch:
    """Calls `listener(frozenset of bookie ids)` whenever the set changes; re-armed."""

    def __init__(self, store: MetadataStore, path: str, listener: BookiesListener, select):
        self.store = store
        self.path = path
        self.listener = listener
        self._select = select
        self.bookies: frozenset = frozenset()
        self._task: asyncio.Task | None = None
        self._next: asyncio.Future | None = None

    async def _read(self) -> tuple[frozenset, asyncio.Future]:
        while True:
            try:
                names, fut = await self.store.children_watched(self.path)
                return frozenset(self._select(names)), fut
            except MetadataNotFoundError:
                version, fut = await self.store.exists_watched(self.path)
                if version is None:
                    return frozenset(), fut

    async def _start(self) -> "BookiesWatch":
        self.bookies, self._next = await self._read()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"watch-bookies-{self.path}")
        return self

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        retry_s = 0.05
        while True:
            await self._next
            try:
                bookies, self._next = await self._read()
            except MetadataStoreError as e:
                log.warning("bookie watch on %s: %s; retrying", self.path, e)
                self._next = asyncio.get_running_loop().create_future()
                self._next.set_result(None)
                await asyncio.sleep(retry_s)
                retry_s = min(retry_s * 2, 2.0)
                continue
            retry_s = 0.05
            if bookies != self.bookies:
                self.bookies = bookies
                try:
                    self.listener(bookies)
                except Exception:
                    log.exception("bookie watch listener failed")
