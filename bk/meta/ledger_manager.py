"""LedgerManager: ledger metadata znodes in BookKeeper's hierarchical layout.

Paths: the ledger id zero-padded to 10 digits and split 2/4/4, the last part
prefixed with `L`: id 1 -> `<root>/00/0000/L0001`, id 1234567890 ->
`<root>/12/3456/L7890`. METADATA.md describes only this (short) layout, so ids
are limited to 0 .. 2^31-2; larger ids are refused with a clear error.

Ids come from `<root>/idgen/ID-<seq>`: create an ephemeral-sequential node,
read the id from its sequence number, delete it. The counter lives in ZooKeeper,
so ids are unique across every client of the cluster.

All writes of existing metadata are compare-and-set on the znode version;
`update_ledger_metadata` wraps the read-decide-write loop.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
from typing import AsyncIterator, Awaitable, Callable

from bk.errors import (
    MetadataExistsError,
    MetadataFormatError,
    MetadataNotEmptyError,
    MetadataNotFoundError,
    MetadataStoreError,
    MetadataVersionError,
    NoSuchLedgerMetadataError,
)
from bk.meta.cluster import paths_for
from bk.meta.ledger_metadata import LedgerMetadata
from bk.meta.store import MetadataStore, join_path

log = logging.getLogger(__name__)

MAX_LEDGER_ID = 2**31 - 2
IDGEN_PREFIX = "ID-"


def _check_ledger_id(ledger_id: int) -> int:
    if isinstance(ledger_id, bool) or not isinstance(ledger_id, int):
        raise MetadataStoreError(f"ledger id must be an int, not {type(ledger_id).__name__}")
    if ledger_id < 0:
        raise MetadataStoreError(f"invalid ledger id {ledger_id}: negative")
    if ledger_id > MAX_LEDGER_ID:
        raise MetadataStoreError(
            f"ledger id {ledger_id} is above {MAX_LEDGER_ID}: only BookKeeper's short hierarchical"
            " layout (ids below 2^31-1) is supported"
        )
    return ledger_id


def ledger_path(root: str, ledger_id: int) -> str:
    digits = f"{_check_ledger_id(ledger_id):010d}"
    return f"{root.rstrip('/')}/{digits[0:2]}/{digits[2:6]}/L{digits[6:10]}"


def ledger_id_from_path(root: str, path: str) -> int:
    """Inverse of `ledger_path`; raises MetadataFormatError for any other path."""
    prefix = root.rstrip("/") + "/"
    parts = path[len(prefix) :].split("/") if path.startswith(prefix) else []
    if (
        len(parts) != 3
        or not _is_level1(parts[0])
        or not _is_level2(parts[1])
        or not _is_leaf(parts[2])
    ):
        raise MetadataFormatError(f"{path} is not a ledger znode under {root}")
    return int(parts[0] + parts[1] + parts[2][1:])


def _is_level1(name: str) -> bool:
    return len(name) == 2 and name.isascii() and name.isdigit()


def _is_level2(name: str) -> bool:
    return len(name) == 4 and name.isascii() and name.isdigit()


def _is_leaf(name: str) -> bool:
    return len(name) == 5 and name[0] == "L" and name[1:].isascii() and name[1:].isdigit()


MetadataUpdate = Callable[[LedgerMetadata], "LedgerMetadata | None | Awaitable[LedgerMetadata | None]"]
MetadataListener = Callable[["LedgerMetadata | None", "int | None"], None]


class LedgerManager:
    def __init__(self, store: MetadataStore, root: str | None = None):
        self.store = store
        self.paths = paths_for(store, root)
        self.root = self.paths.root

    def path(self, ledger_id: int) -> str:
        return ledger_path(self.root, ledger_id)

    # ------------------------------------------------------------------ ids
    async def generate_ledger_id(self) -> int:
        prefix = join_path(self.paths.idgen, IDGEN_PREFIX)
        node = await self.store.create(prefix, b"", ephemeral=True, sequential=True, make_parents=True)
        try:
            await self.store.delete(node)
        except MetadataNotFoundError:
            pass
        ledger_id = int(node[len(prefix) :])
        if ledger_id < 0 or ledger_id > MAX_LEDGER_ID:
            raise MetadataStoreError(
                f"ledger id generator at {self.paths.idgen} returned {ledger_id}: the id space of the"
                " short hierarchical layout is exhausted"
            )
        return ledger_id

    # ------------------------------------------------------------------ CRUD
    async def create_ledger_metadata(self, ledger_id: int, metadata: LedgerMetadata) -> int:
        """Store the metadata of a new ledger; returns its version (0). Raises
        MetadataExistsError if the ledger already has metadata."""
        path = self.path(ledger_id)
        data = metadata.serialize()
        try:
            await self.store.create(path, data, make_parents=True)
        except MetadataExistsError:
            raise MetadataExistsError(f"ledger {ledger_id} already exists ({path})") from None
        return 0

    async def read_ledger_metadata(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        path = self.path(ledger_id)
        try:
            data, version = await self.store.get(path)
        except MetadataNotFoundError:
            raise NoSuchLedgerMetadataError(f"ledger {ledger_id} has no metadata ({path})") from None
        return self._decode(ledger_id, data), version

    def _decode(self, ledger_id: int, data: bytes) -> LedgerMetadata:
        try:
            return LedgerMetadata.deserialize(data)
        except MetadataFormatError as e:
            raise MetadataFormatError(f"ledger {ledger_id}: {e}") from None

    async def write_ledger_metadata(self, ledger_id: int, metadata: LedgerMetadata, version: int) -> int:
        """Compare-and-set: replace the metadata if its znode is still at `version`;
        returns the new version. MetadataVersionError if someone changed it first."""
        if version < 0:
            raise MetadataStoreError("write_ledger_metadata needs the version that was read (CAS)")
        path = self.path(ledger_id)
        try:
            return await self.store.set(path, metadata.serialize(), version)
        except MetadataNotFoundError:
            raise NoSuchLedgerMetadataError(f"ledger {ledger_id} has no metadata ({path})") from None
        except MetadataVersionError:
            raise MetadataVersionError(f"ledger {ledger_id} metadata changed since version {version}") from None

    async def update_ledger_metadata(
        self, ledger_id: int, update: MetadataUpdate, *, max_attempts: int = 100
    ) -> tuple[LedgerMetadata, int]:
        """Read, decide, compare-and-set, and on a conflict read and decide again.

        `update(current)` returns the new metadata, or None (or `current`) when no
        change is needed any more; it may be a coroutine function and may raise
        (e.g. LedgerClosedError) to abandon. Returns the metadata and version now
        stored."""
        for _ in range(max_attempts):
            current, version = await self.read_ledger_metadata(ledger_id)
            new = update(current)
            if inspect.isawaitable(new):
                new = await new
            if new is None or new == current:
                return current, version
            try:
                return new, await self.write_ledger_metadata(ledger_id, new, version)
            except MetadataVersionError:
                continue
        raise MetadataVersionError(f"ledger {ledger_id}: metadata update lost {max_attempts} races in a row")

    async def remove_ledger_metadata(self, ledger_id: int, version: int = -1) -> None:
        path = self.path(ledger_id)
        try:
            await self.store.delete(path, version)
        except MetadataNotFoundError:
            raise NoSuchLedgerMetadataError(f"ledger {ledger_id} has no metadata ({path})") from None
        except MetadataVersionError:
            raise MetadataVersionError(f"ledger {ledger_id} metadata changed since version {version}") from None
        # Like BookKeeper, drop the now-empty hierarchy levels (optimistically: a
        # concurrent create may refill them, and then they stay).
        for parent in (path.rsplit("/", 1)[0], path.rsplit("/", 2)[0]):
            try:
                await self.store.delete(parent)
            except (MetadataNotEmptyError, MetadataNotFoundError):
                break

    async def ledger_exists(self, ledger_id: int) -> bool:
        return await self.store.exists(self.path(ledger_id)) is not None

    # ------------------------------------------------------------------ listing
    async def iter_ledger_ids(self) -> AsyncIterator[int]:
        """Every ledger id, ascending, walking the hierarchy level by level. Nodes
        that are not ledger levels (available, cookies, idgen, LAYOUT, ...) are skipped;
        levels deleted during the walk are skipped too."""
        for level1 in await self._children_or_empty(self.root):
            if not _is_level1(level1):
                continue
            path1 = join_path(self.root, level1)
            for level2 in await self._children_or_empty(path1):
                if not _is_level2(level2):
                    continue
                path2 = join_path(path1, level2)
                for leaf in await self._children_or_empty(path2):
                    if _is_leaf(leaf):
                        yield int(level1 + level2 + leaf[1:])

    async def list_ledger_ids(self) -> list[int]:
        return [ledger_id async for ledger_id in self.iter_ledger_ids()]

    async def iter_ledger_metadata(self, ledger_ids=None, *, concurrency: int = 64
                                   ) -> AsyncIterator[tuple[int, LedgerMetadata, int]]:
        """(ledger_id, metadata, version) of every ledger (or of `ledger_ids`), ascending by
        batch, `concurrency` reads at a time. A ledger deleted during the walk is skipped; any
        other failure (store error, session loss, malformed metadata) propagates: callers that
        decide from the whole list (BP-46 phase one, GC) must never take an error for "none"."""
        ids = await self.list_ledger_ids() if ledger_ids is None else list(ledger_ids)
        step = max(1, concurrency)
        for start in range(0, len(ids), step):
            batch = ids[start:start + step]
            answers = await asyncio.gather(*(self.read_ledger_metadata(i) for i in batch), return_exceptions=True)
            for ledger_id, answer in zip(batch, answers):
                if isinstance(answer, NoSuchLedgerMetadataError):
                    continue
                if isinstance(answer, BaseException):
                    raise answer
                yield ledger_id, answer[0], answer[1]

    async def _children_or_empty(self, path: str) -> list[str]:
        try:
            return await self.store.children(path)
        except MetadataNotFoundError:
            return []

    # ------------------------------------------------------------------ watching
    async def watch_ledger_metadata(self, ledger_id: int, listener: MetadataListener) -> "LedgerMetadataWatch":
        """Call `listener(metadata, version)` on every later change of the ledger's
        metadata, and `listener(None, None)` once if it is deleted (then the watch
        ends). Raises NoSuchLedgerMetadataError if the ledger has no metadata now."""
        watch = LedgerMetadataWatch(self, ledger_id, listener)
        await watch._start()
        return watch


class LedgerMetadataWatch:
    """A re-armed watch on one ledger's metadata; `cancel()` stops it."""

    def __init__(self, manager: LedgerManager, ledger_id: int, listener: MetadataListener):
        self.manager = manager
        self.ledger_id = ledger_id
        self.listener = listener
        self.path = manager.path(ledger_id)
        self.metadata: LedgerMetadata | None = None
        self.version: int | None = None
        self._task: asyncio.Task | None = None
        self._next: asyncio.Future | None = None

    async def _start(self) -> None:
        store = self.manager.store
        try:
            data, self.version, self._next = await store.get_watched(self.path)
        except MetadataNotFoundError:
            raise NoSuchLedgerMetadataError(f"ledger {self.ledger_id} has no metadata ({self.path})") from None
        self.metadata = self.manager._decode(self.ledger_id, data)
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"watch-ledger-{self.ledger_id}")

    @property
    def active(self) -> bool:
        return self._task is not None and not self._task.done()

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        store = self.manager.store
        retry_s = 0.05
        while True:
            event = await self._next
            try:
                data, version, self._next = await store.get_watched(self.path)
            except MetadataNotFoundError:
                self.metadata, self.version = None, None
                self._call(None, None)
                return
            except MetadataStoreError as e:  # connection trouble: re-arm when it is back
                log.warning("ledger %d metadata watch: %s; retrying", self.ledger_id, e)
                self._next = asyncio.get_running_loop().create_future()
                self._next.set_result(event)
                await asyncio.sleep(retry_s)
                retry_s = min(retry_s * 2, 2.0)
                continue
            retry_s = 0.05
            try:
                metadata = self.manager._decode(self.ledger_id, data)
            except MetadataFormatError as e:
                log.error("ledger %d metadata watch: %s", self.ledger_id, e)
                continue
            if version == self.version and metadata == self.metadata:
                continue  # e.g. the watch dropped (DISCONNECTED) but nothing changed
            self.metadata, self.version = metadata, version
            self._call(metadata, version)

    def _call(self, metadata, version) -> None:
        try:
            self.listener(metadata, version)
        except Exception:  # a listener bug must not kill the watch
            log.exception("ledger %d metadata listener failed", self.ledger_id)

