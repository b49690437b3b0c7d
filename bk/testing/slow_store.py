"""A metadata store that answers slowly, or loses replies: injected around a real one.

    store = SlowStore(InMemoryStore(tree), delay_s=0.02)            # every read waits 20 ms
    store = SlowStore(zk_store, lose_reply=lambda op, path: op == "create" and "/locks/" in path)

`delay_s` is slept before each call named in `delayed` (the reads by default), so many
calls in flight overlap like requests to a slow ZooKeeper. `lose_reply(op, path)`
returning True applies the call on the inner store and then never answers: the caller
sees only its own timeout, the outcome it never learnt is in the store (ZooKeeper
created the node, the reply was lost). `fail(op, path)` returning True makes the call
fail as a connection loss would, without reaching the store. `calls` counts the calls.
"""
from __future__ import annotations

import asyncio
import collections
from typing import Callable

from bk.errors import MetadataStoreError
from bk.meta.store import MetadataStore, SessionListener, Watcher

READS = ("get", "get_with_owner", "exists", "children")


class SlowStore(MetadataStore):
    def __init__(self, inner: MetadataStore, *, delay_s: float = 0.0, delayed: tuple[str, ...] = READS,
                 lose_reply: Callable[[str, str], bool] | None = None,
                 fail: Callable[[str, str], bool] | None = None):
        self.inner = inner
        self.ledgers_root = inner.ledgers_root
        self.delay_s = delay_s
        self.delayed = set(delayed)
        self.lose_reply = lose_reply or (lambda op, path: False)
        self.fail = fail or (lambda op, path: False)
        self.calls: collections.Counter = collections.Counter()
        self.lost: list[tuple[str, str]] = []

    async def _do(self, op: str, path: str, call):
        self.calls[op] += 1
        if self.delay_s and op in self.delayed:
            await asyncio.sleep(self.delay_s)
        if self.fail(op, path):
            err = MetadataStoreError(f"ZooKeeper connection lost during {op} {path} (injected)")
            err.connection_loss = True
            raise err
        result = await call()
        if self.lose_reply(op, path):
            self.lost.append((op, path))
            await asyncio.Event().wait()  # the reply never comes: only a timeout ends this
        return result

    async def get(self, path: str, watch: Watcher | None = None):
        return await self._do("get", path, lambda: self.inner.get(path, watch))

    async def get_with_owner(self, path: str):
        return await self._do("get_with_owner", path, lambda: self.inner.get_with_owner(path))

    async def exists(self, path: str, watch: Watcher | None = None):
        return await self._do("exists", path, lambda: self.inner.exists(path, watch))

    async def children(self, path: str, watch: Watcher | None = None):
        return await self._do("children", path, lambda: self.inner.children(path, watch))

    async def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False, sequential: bool = False,
                     make_parents: bool = False) -> str:
        return await self._do("create", path, lambda: self.inner.create(
            path, data, ephemeral=ephemeral, sequential=sequential, make_parents=make_parents))

    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        return await self._do("set", path, lambda: self.inner.set(path, data, version))

    async def _delete_node(self, path: str, version: int) -> None:
        return await self._do("delete", path, lambda: self.inner._delete_node(path, version))

    @property
    def session_id(self) -> int:
        return self.inner.session_id

    @property
    def closed(self) -> bool:
        return self.inner.closed

    async def close(self) -> None:
        await self.inner.close()

    async def expire_session(self) -> None:
        await self.inner.expire_session()

    def add_session_listener(self, listener: SessionListener) -> None:
        self.inner.add_session_listener(listener)

    def remove_session_listener(self, listener: SessionListener) -> None:
        self.inner.remove_session_listener(listener)
