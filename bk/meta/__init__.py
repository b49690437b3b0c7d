"""Cluster metadata: the store interface, ZooKeeper and in-memory stores, and the
managers written once on top (cluster init, LedgerManager, RegistrationManager,
cookies, LedgerUnderreplicationManager). The only package that imports kazoo
(in `bk.meta.zk`, loaded only when a zk:// URI is opened)."""
from __future__ import annotations

from bk.meta.store import (
    EventType,
    MetadataServiceUri,
    MetadataStore,
    SessionState,
    WatchEvent,
    parse_metadata_uri,
)


async def open_store(uri: str, **kwargs) -> MetadataStore:
    """Open one session on the metadata service named by `uri`.

    `zk://host:port[,host:port]/ledgers` -> ZooKeeperStore (kwargs:
    session_timeout_s, connect_timeout_s); `mem://name/ledgers` -> a new session
    on the process-wide in-memory tree `name`. The store's `ledgers_root` is the
    URI's path (default /ledgers)."""
    parsed = parse_metadata_uri(uri)
    if parsed.scheme == "mem":
        from bk.meta.memory import InMemoryStore

        return InMemoryStore.shared(parsed.hosts, root=parsed.root)
    from bk.meta.zk import ZooKeeperStore

    return await ZooKeeperStore.connect(parsed.hosts, root=parsed.root, **kwargs)


__all__ = [
    "EventType",
    "MetadataServiceUri",
    "MetadataStore",
    "SessionState",
    "WatchEvent",
    "open_store",
    "parse_metadata_uri",
]
