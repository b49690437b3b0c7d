"""LedgerUnderreplicationManager: the AutoRecovery work queue in ZooKeeper.

- A ledger that lost replicas is marked at
  `<root>/underreplication/ledgers/<h>/<h>/<h>/<h>/urL<%010d id>` (the four `<h>`
  are the 64-bit id's 16-bit groups, high first, as 4 lower-case hex digits);
  data = text `UnderreplicatedLedgerFormat` (missing bookie ids + creation ms).
  Marking an already-marked ledger merges the replica lists with a CAS loop.
- A replication worker (or GC, for an over-replicated copy) takes the ephemeral lock
  `<root>/underreplication/locks/urL<%010d id>` (text `LockDataFormat`); it is
  released on completion or when the worker's session dies.
- A lock create or delete whose reply never came (a timeout cancelled it, the
  connection dropped) may have been applied: the node would then block every other
  worker until this session ends, which for a bookie is never. Such a path is
  resolved in the background: re-read after the lost call (ZooKeeper answers one
  session's requests in order), deleted if it is this session's node with the data
  this manager wrote and no manager of this session holds it, retried while the
  store errs, dropped when the node is gone or someone else's.
- The marker is removed only at the version the worker read: if the auditor
  added a missing bookie meanwhile, the ledger stays marked.
- `underreplication/disable` existing = autorecovery paused;
  `underreplication/lostBookieRecoveryDelay` = the live delay in seconds (text).
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
import weakref
from dataclasses import dataclass
from typing import AsyncIterator, Iterable

from bk.errors import (
    MetadataExistsError,
    MetadataFormatError,
    MetadataNotEmptyError,
    MetadataNotFoundError,
    MetadataStoreError,
    MetadataVersionError,
)
from bk.meta import formats
from bk.meta.cluster import paths_for
from bk.meta.store import MetadataStore, SessionState, join_path

log = logging.getLogger(__name__)

UR_PREFIX = "urL"
# lock paths held through each store (session), by any manager on it: a lost lock is
# released only when no manager of the session holds that path
_HELD: "weakref.WeakKeyDictionary[MetadataStore, set[str]]" = weakref.WeakKeyDictionary()
_RESOLVE_RETRY_MAX_S = 5.0


def _check_id(ledger_id: int) -> int:
    if isinstance(ledger_id, bool) or not isinstance(ledger_id, int) or not 0 <= ledger_id < 2**63:
        raise MetadataStoreError(f"invalid ledger id {ledger_id!r}")
    return ledger_id


def ur_node_name(ledger_id: int) -> str:
    return f"{UR_PREFIX}{_check_id(ledger_id):010d}"


def ur_ledger_path(base: str, ledger_id: int) -> str:
    """`base` is `<root>/underreplication/ledgers`."""
    _check_id(ledger_id)
    groups = [f"{(ledger_id >> shift) & 0xFFFF:04x}" for shift in (48, 32, 16, 0)]
    return join_path(base, *groups, ur_node_name(ledger_id))


def _is_hex4(name: str) -> bool:
    return len(name) == 4 and all(c in "0123456789abcdef" for c in name)


def _ur_id(name: str) -> int | None:
    digits = name[len(UR_PREFIX) :]
    if name.startswith(UR_PREFIX) and digits.isascii() and digits.isdigit():
        return int(digits)
    return None


@dataclass(frozen=True)
class UnderreplicatedLedger:
    ledger_id: int
    replicas: tuple[str, ...]  # the missing bookies
    ctime_ms: int | None
    version: int  # znode version, for mark_ledger_replicated


class LedgerUnderreplicationManager:
    def __init__(self, store: MetadataStore, root: str | None = None):
        self.store = store
        self.paths = paths_for(store, root)
        self._locks: dict[str, bytes] = {}  # lock znodes this manager holds -> the data it wrote
        self._session_locks = _HELD.setdefault(store, set())  # ... and every manager of the session
        self._resolving: dict[str, asyncio.Task] = {}  # lost lock calls being resolved
        self.lost_locks_released = 0
        store.add_session_listener(self._on_session_state)

    def _on_session_state(self, state: SessionState) -> None:
        if state is SessionState.EXPIRED:
            self._session_locks.difference_update(self._locks)
            self._locks.clear()  # ephemeral locks died with the session

    def marker_path(self, ledger_id: int) -> str:
        return ur_ledger_path(self.paths.ur_ledgers, ledger_id)

    def lock_path(self, ledger_id: int) -> str:
        return join_path(self.paths.ur_locks, ur_node_name(ledger_id))

    # ------------------------------------------------------------------ markers
    async def mark_ledger_underreplicated(self, ledger_id: int, missing_replicas: Iterable[str]) -> None:
        """Mark (or add missing bookies to the mark of) a ledger."""
        missing = list(dict.fromkeys(missing_replicas))
        path = self.marker_path(ledger_id)
        msg = formats.UnderreplicatedLedgerFormat(replica=missing, ctime=int(time.time() * 1000))
        while True:
            try:
                await self.store.create(path, formats.to_text(msg).encode("utf-8"), make_parents=True)
                return
            except MetadataExistsError:
                pass
            try:
                data, version = await self.store.get(path)
            except MetadataNotFoundError:
                continue  # replicated and removed meanwhile: create again
            current = self._parse(path, data)
            merged = [r for r in missing if r not in current.replica]
            if not merged:
                return
            current.replica.extend(merged)
            try:
                await self.store.set(path, formats.to_text(current).encode("utf-8"), version)
                return
            except (MetadataVersionError, MetadataNotFoundError):
                continue

    @staticmethod
    def _parse(path: str, data: bytes):
        try:
            return formats.from_text(formats.UnderreplicatedLedgerFormat, data)
        except MetadataFormatError as e:
            raise MetadataFormatError(f"{path}: {e}") from None

    async def get_ledger_unreplication_info(self, ledger_id: int) -> UnderreplicatedLedger | None:
        path = self.marker_path(ledger_id)
        try:
            data, version = await self.store.get(path)
        except MetadataNotFoundError:
            return None
        msg = self._parse(path, data)
        return UnderreplicatedLedger(
            ledger_id, tuple(msg.replica), msg.ctime if msg.HasField("ctime") else None, version
        )

    async def is_ledger_underreplicated(self, ledger_id: int) -> bool:
        return await self.store.exists(self.marker_path(ledger_id)) is not None

    async def mark_ledger_replicated(self, ledger_id: int, version: int | None = None) -> bool:
        """Remove the marker (at `version` if given: the one the worker acted on) and
        release this session's lock on the ledger. Returns False if the marker changed
        meanwhile (new missing replicas: still under-replicated) or was already gone."""
        path = self.marker_path(ledger_id)
        removed = False
        try:
            if version is None:
                _, version = await self.store.get(path)
            await self.store.delete(path, version)
            removed = True
        except (MetadataNotFoundError, MetadataVersionError):
            pass
        if removed:
            await self._prune(path)
        await self.release_ledger_lock(ledger_id)
        return removed

    async def _prune(self, path: str) -> None:
        # drop the now-empty hex levels, deepest first, stopping at the first in use
        parent = path.rsplit("/", 1)[0]
        for _ in range(4):
            try:
                await self.store.delete(parent)
            except (MetadataNotEmptyError, MetadataNotFoundError):
                return
            parent = parent.rsplit("/", 1)[0]

    async def iter_underreplicated_ledgers(self, *, shuffle: bool = False) -> AsyncIterator[int]:
        """Marked ledger ids (ascending, or shuffled level by level to spread workers)."""
        order = (lambda names: random.sample(names, len(names))) if shuffle else (lambda names: names)

        async def walk(path: str, depth: int):
            names = await self._children_or_empty(path)
            for name in order(names):
                if depth < 4:
                    if _is_hex4(name):
                        async for ledger_id in walk(join_path(path, name), depth + 1):
                            yield ledger_id
                else:
                    ledger_id = _ur_id(name)
                    if ledger_id is not None:
                        yield ledger_id

        async for ledger_id in walk(self.paths.ur_ledgers, 0):
            yield ledger_id

    async def list_underreplicated_ledgers(self) -> list[int]:
        return [ledger_id async for ledger_id in self.iter_underreplicated_ledgers()]

    async def _children_or_empty(self, path: str) -> list[str]:
        try:
            return await self.store.children(path)
        except MetadataNotFoundError:
            return []

    # ------------------------------------------------------------------ locks
    async def acquire_ledger_lock(self, ledger_id: int, holder: str) -> bool:
        """Take the ephemeral replication lock; False if another session holds it."""
        path = self.lock_path(ledger_id)
        data = formats.to_text(formats.LockDataFormat(bookieId=holder)).encode("utf-8")
        try:
            await self.store.create(path, data, ephemeral=True, make_parents=True)
        except MetadataExistsError:
            return False
        except BaseException:  # lost reply, timeout (cancelled): the node may exist, ours
            self._resolve_lost_lock(path, data)
            raise
        self._locks[path] = data
        self._session_locks.add(path)
        return True

    async def release_ledger_lock(self, ledger_id: int) -> None:
        """Release the lock if this session holds it (other sessions' locks are kept)."""
        path = self.lock_path(ledger_id)
        if path not in self._locks:
            return
        data = self._locks.pop(path)
        self._session_locks.discard(path)
        try:
            await self.store.delete(path)
        except MetadataNotFoundError:
            pass
        except BaseException:  # lost reply, timeout: the node may still be there
            self._resolve_lost_lock(path, data)
            raise

    def _resolve_lost_lock(self, path: str, data: bytes) -> None:
        """Find and delete, in the background, the lock node a lost create (or delete) may
        have left; `data` is what this manager wrote in it."""
        if path in self._resolving:
            return
        try:
            task = asyncio.get_running_loop().create_task(self._resolve(path, data))
        except RuntimeError:
            return  # no loop: the store is going away with its session
        self._resolving[path] = task
        task.add_done_callback(lambda t, p=path: self._resolving.pop(p, None) if self._resolving.get(p) is t else None)

    async def _resolve(self, path: str, data: bytes) -> None:
        delay = 0.1
        while True:
            if path in self._session_locks:
                return  # taken (again) by a manager of this session: it releases it
            try:
                node_data, version, owner = await self.store.get_with_owner(path)
                if owner != self.store.session_id or node_data != data or path in self._session_locks:
                    return  # another session's lock, or another holder's on this session
                await self.store.delete(path, version)
                self.lost_locks_released += 1
                log.warning("released replication lock %s: a create or delete of it timed out or lost its "
                            "reply, and it was left behind", path)
                return
            except (MetadataNotFoundError, MetadataVersionError):
                return  # never created, already gone, or re-created since
            except MetadataStoreError as e:  # connection loss, closed store: again later
                if self.store.closed:
                    return  # the session ended: its ephemeral nodes with it
                log.info("replication lock %s: cannot check it yet (%s); retrying", path, e)
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RESOLVE_RETRY_MAX_S)

    async def wait_lost_locks_resolved(self) -> None:
        """Wait until every lost lock call seen so far is resolved (tests, close)."""
        while self._resolving:
            await asyncio.gather(*list(self._resolving.values()), return_exceptions=True)

    async def lock_holder(self, ledger_id: int) -> str | None:
        try:
            data, _ = await self.store.get(self.lock_path(ledger_id))
        except MetadataNotFoundError:
            return None
        return formats.from_text(formats.LockDataFormat, data).bookieId

    async def poll_ledger_to_rereplicate(self, holder: str) -> UnderreplicatedLedger | None:
        """Lock one marked ledger nobody is working on; None if there is none now."""
        async for ledger_id in self.iter_underreplicated_ledgers(shuffle=True):
            if not await self.acquire_ledger_lock(ledger_id, holder):
                continue
            info = await self.get_ledger_unreplication_info(ledger_id)
            if info is not None:
                return info
            await self.release_ledger_lock(ledger_id)  # replicated meanwhile
        return None

    # ------------------------------------------------------------------ switches
    async def disable_ledger_replication(self) -> None:
        try:
            await self.store.create(self.paths.replication_disable, b"", make_parents=True)
        except MetadataExistsError:
            pass

    async def enable_ledger_replication(self) -> None:
        try:
            await self.store.delete(self.paths.replication_disable)
        except MetadataNotFoundError:
            pass

    async def is_ledger_replication_enabled(self) -> bool:
        return await self.store.exists(self.paths.replication_disable) is None

    async def wait_until_replication_enabled(self) -> None:
        while True:
            version, changed = await self.store.exists_watched(self.paths.replication_disable)
            if version is None:
                changed.cancel()
                return
            await changed

    async def get_lost_bookie_recovery_delay(self, default_s: int = 0) -> int:
        path = self.paths.lost_bookie_recovery_delay
        try:
            data, _ = await self.store.get(path)
        except MetadataNotFoundError:
            return default_s
        try:
            return int(data.decode("ascii").strip())
        except (UnicodeDecodeError, ValueError):
            raise MetadataFormatError(f"{path} holds {data[:40]!r}, not a number of seconds") from None

    async def set_lost_bookie_recovery_delay(self, delay_s: int) -> None:
        if isinstance(delay_s, bool) or not isinstance(delay_s, int) or delay_s < 0:
            raise MetadataStoreError(f"lost bookie recovery delay must be a non-negative int, not {delay_s!r}")
        await self._put(self.paths.lost_bookie_recovery_delay, str(delay_s).encode("ascii"))

    async def _put(self, path: str, data: bytes) -> None:
        """Set the znode, creating it (and its parents) when missing."""
        while True:
            try:
                await self.store.set(path, data)
                return
            except MetadataNotFoundError:
                pass
            try:
                await self.store.create(path, data, make_parents=True)
                return
            except MetadataExistsError:
                continue

    # The auditor's periodic checks and the field of their last-run znode (BookKeeper's
    # CheckAllLedgersFormat & co.): `bk shell forceauditchecks` sets them back, the auditor
    # reads them at its start to run an overdue check at once.
    CHECKS = {"checkallledgers": ("CheckAllLedgersFormat", "checkAllLedgersCTime"),
              "placementpolicycheck": ("PlacementPolicyCheckFormat", "placementPolicyCheckCTime"),
              "replicascheck": ("ReplicasCheckFormat", "replicasCheckCTime")}

    async def get_check_ctime(self, check: str) -> int | None:
        """When the auditor last finished `check` (ms since the epoch), None if never recorded."""
        msg_name, field_name = self.CHECKS[check]
        path = self.paths.check_ctime(check)
        try:
            data, _ = await self.store.get(path)
        except MetadataNotFoundError:
            return None
        try:
            msg = formats.from_binary(getattr(formats, msg_name), data)
        except MetadataFormatError as e:
            raise MetadataFormatError(f"{path}: {e}") from None
        return getattr(msg, field_name) if msg.HasField(field_name) else None

    async def set_check_ctime(self, check: str, ctime_ms: int) -> None:
        msg_name, field_name = self.CHECKS[check]
        msg = getattr(formats, msg_name)()
        setattr(msg, field_name, int(ctime_ms))
        await self._put(self.paths.check_ctime(check), formats.to_binary(msg))

    async def lost_bookie_recovery_delay_watched(self, default_s: int = 0) -> tuple[int, asyncio.Future]:
        """(current delay, future of the next change event) for the auditor."""
        version, changed = await self.store.exists_watched(self.paths.lost_bookie_recovery_delay)
        if version is None:
            return default_s, changed
        return await self.get_lost_bookie_recovery_delay(default_s), changed

    async def close(self) -> None:
        self.store.remove_session_listener(self._on_session_state)
        for task in list(self._resolving.values()):
            task.cancel()  # the session ends with the store: its ephemeral locks with it
        await asyncio.gather(*self._resolving.values(), return_exceptions=True)
        self._session_locks.difference_update(self._locks)
