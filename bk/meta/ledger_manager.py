"""LedgerManager: ledger metadata znodes in BookKeeper's hierarchical layout.

Paths (BookKeeper's HierarchicalLedgerManager, a hybrid of two layouts):
- ids below 2^31-1: the id zero-padded to 10 digits and split 2/4/4, the last
  part prefixed with `L`: id 1 -> `<root>/00/0000/L0001`, id 1234567890 ->
  `<root>/12/3456/L7890` (the short layout, METADATA.md);
- ids from 2^31-1 up to 2^63-1: zero-padded to 19 digits and split 3/4/4/4/4
  (LongHierarchicalLedgerManager): id 2^31-1 -> `<root>/000/0000/0021/4748/L3647`.
A first level of 2 digits is short, of 3 digits long, so both live under one root.

Ids come from `<root>/idgen/ID-<seq>`: create an ephemeral-sequential node,
read the id from its sequence number, delete it. The counter lives in ZooKeeper,
so ids are unique across every client of the cluster. Once that counter reaches
2^31-1, ids come from BookKeeper's idgen-long scheme (LongZkLedgerIdGenerator):
`<root>/idgen-long/HOB-<high 32 bits, 10 digits>/ID-<seq>` gives the id
`(high << 32) | seq`; when a HOB- directory's counter reaches 2^31-1 the next
HOB- (high + 1) is created. Once `idgen-long` exists every client uses it.

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

SHORT_ID_LIMIT = 2**31 - 1  # Integer.MAX_VALUE: ids below it use the short layout and the short idgen
MAX_SHORT_LEDGER_ID = SHORT_ID_LIMIT - 1
MAX_LEDGER_ID = 2**63 - 1
IDGEN_PREFIX = "ID-"
IDGEN_LONG = "idgen-long"
HOB_PREFIX = "HOB-"
HOB_KEEP = 3  # HOB- directories left behind (BookKeeper keeps three against races)


def _check_ledger_id(ledger_id: int) -> int:
    if isinstance(ledger_id, bool) or not isinstance(ledger_id, int):
        raise MetadataStoreError(f"ledger id must be an int, not {type(ledger_id).__name__}")
    if ledger_id < 0:
        raise MetadataStoreError(f"invalid ledger id {ledger_id}: negative")
    if ledger_id > MAX_LEDGER_ID:
        raise MetadataStoreError(f"ledger id {ledger_id} is above {MAX_LEDGER_ID}")
    return ledger_id


def ledger_path(root: str, ledger_id: int) -> str:
    root = root.rstrip("/")
    if _check_ledger_id(ledger_id) < SHORT_ID_LIMIT:
        d = f"{ledger_id:010d}"
        return f"{root}/{d[0:2]}/{d[2:6]}/L{d[6:10]}"
    d = f"{ledger_id:019d}"
    return f"{root}/{d[0:3]}/{d[3:7]}/{d[7:11]}/{d[11:15]}/L{d[15:19]}"


def ledger_id_from_path(root: str, path: str) -> int:
    """Inverse of `ledger_path`; raises MetadataFormatError for any other path."""
    prefix = root.rstrip("/") + "/"
    parts = path[len(prefix) :].split("/") if path.startswith(prefix) else []
    if len(parts) == 3 and _is_level1(parts[0]) and _is_level2(parts[1]) and _is_leaf(parts[2]):
        return int(parts[0] + parts[1] + parts[2][1:])
    if (len(parts) == 5 and _is_long_level1(parts[0]) and all(_is_level2(p) for p in parts[1:4])
            and _is_leaf(parts[4])):
        ledger_id = int("".join(parts[:4]) + parts[4][1:])
        if SHORT_ID_LIMIT <= ledger_id <= MAX_LEDGER_ID:
            return ledger_id
    raise MetadataFormatError(f"{path} is not a ledger znode under {root}")


def _is_level1(name: str) -> bool:
    return len(name) == 2 and name.isascii() and name.isdigit()


def _is_long_level1(name: str) -> bool:
    return len(name) == 3 and name.isascii() and name.isdigit()


def _is_level2(name: str) -> bool:
    return len(name) == 4 and name.isascii() and name.isdigit()


def _is_leaf(name: str) -> bool:
    return len(name) == 5 and name[0] == "L" and name[1:].isascii() and name[1:].isdigit()


def _hob(name: str) -> int | None:
    digits = name[len(HOB_PREFIX):]
    return int(digits) if name.startswith(HOB_PREFIX) and digits.isascii() and digits.isdigit() else None


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
    async def _sequence(self, directory: str) -> int:
        """The next number of an ephemeral-sequential counter under `directory` (its node deleted)."""
        prefix = join_path(directory, IDGEN_PREFIX)
        node = await self.store.create(prefix, b"", ephemeral=True, sequential=True, make_parents=True)
        try:
            await self.store.delete(node)
        except MetadataNotFoundError:
            pass
        return int(node[len(prefix) :])

    async def generate_ledger_id(self) -> int:
        idgen_long = join_path(self.root, IDGEN_LONG)
        if await self.store.exists(idgen_long) is None:
            ledger_id = await self._sequence(self.paths.idgen)
            if 0 <= ledger_id < SHORT_ID_LIMIT:
                return ledger_id
            log.warning("the ledger id counter at %s reached 2^31-1: switching to %s (63-bit ids)",
                        self.paths.idgen, idgen_long)
            try:
                await self.store.create(idgen_long, b"", make_parents=True)
            except MetadataExistsError:
                pass
        return await self._generate_long_ledger_id(idgen_long)

    async def _generate_long_ledger_id(self, idgen_long: str) -> int:
        for _ in range(8):  # each pass either returns or opens the next HOB- directory
            hobs = sorted(h for h in map(_hob, await self._children_or_empty(idgen_long)) if h is not None)
            high = hobs[-1] if hobs else 1
            directory = join_path(idgen_long, f"{HOB_PREFIX}{high:010d}")
            if not hobs:
                await self._create_quietly(directory)
                continue
            low = await self._sequence(directory)
            if 0 <= low < SHORT_ID_LIMIT:
                for old in hobs[:-HOB_KEEP]:  # garbage: BookKeeper keeps the last three
                    try:
                        await self.store.delete(join_path(idgen_long, f"{HOB_PREFIX}{old:010d}"))
                    except MetadataStoreError:
                        pass
                return (high << 32) | low
            if high + 1 >= 2**31:
                raise MetadataStoreError(f"the ledger id space under {idgen_long} is exhausted")
            await self._create_quietly(join_path(idgen_long, f"{HOB_PREFIX}{high + 1:010d}"))
        raise MetadataStoreError(f"could not take a ledger id under {idgen_long}")

    async def _create_quietly(self, path: str) -> None:
        try:
            await self.store.create(path, b"", make_parents=True)
        except MetadataExistsError:
            pass

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
        levels = 2 if ledger_id < SHORT_ID_LIMIT else 4
        for parent in (path.rsplit("/", i)[0] for i in range(1, levels + 1)):
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
        top = sorted(await self._children_or_empty(self.root))
        for level1 in [n for n in top if _is_level1(n)] + [n for n in top if _is_long_level1(n)]:
            async for ledger_id in self._walk(join_path(self.root, level1), level1, 3 if len(level1) == 2 else 5):
                yield ledger_id

    async def _walk(self, path: str, digits: str, depth: int) -> AsyncIterator[int]:
        """Ledger ids under one level (`depth` path parts below the root make a ledger path)."""
        children = sorted(await self._children_or_empty(path))
        if depth == 2:
            for leaf in children:
                if _is_leaf(leaf):
                    yield int(digits + leaf[1:])
            return
        for child in children:
            if _is_level2(child):
                async for ledger_id in self._walk(join_path(path, child), digits + child, depth - 1):
                    yield ledger_id

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

