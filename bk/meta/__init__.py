"""Cluster metadata: the store interface, ZooKeeper and in-memory stores, and the
managers written once on top (cluster init, LedgerManager, RegistrationManager,
cookies, LedgerUnderreplicationManager). The only package that imports kazoo
(in `bk.meta.zk`, loaded only when a zk:// URI is opened)."""
from __future__ import annotations

import os

from bk.errors import ConfigError
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

    if "zk_digest_auth" not in kwargs:  # an operator's exported settings reach every bk process
        kwargs = {**security_options(os.environ.get("BK_ZK_DIGEST_AUTH_PATH", ""),
                                     os.environ.get("BK_ZK_ENABLE_SECURITY", "").lower() in ("1", "true", "yes")),
                  **kwargs}
    return await ZooKeeperStore.connect(parsed.hosts, root=parsed.root, **kwargs)


def security_options(digest_auth_path: str, enable_security: bool) -> dict:
    """open_store's ZooKeeper security kwargs from the settings zk_digest_auth_path (a file holding
    `user:password`) and zk_enable_security (CREATOR_ALL ACLs on the znodes bk creates)."""
    if not digest_auth_path:
        if enable_security:
            raise ConfigError("zk_enable_security needs zk_digest_auth_path (a file holding user:password)")
        return {}
    try:
        with open(digest_auth_path, encoding="utf-8") as fh:
            digest = fh.read().strip()
    except OSError as e:
        raise ConfigError(f"bad value for 'zk_digest_auth_path': cannot read {digest_auth_path}: {e}") from None
    if ":" not in digest:
        raise ConfigError(f"bad value for 'zk_digest_auth_path': {digest_auth_path} must hold user:password")
    return {"zk_digest_auth": digest, "zk_enable_security": enable_security}


def store_options(config) -> dict:
    """open_store kwargs for a bookie's BookieConfig (session timeout and ZooKeeper security)."""
    return {"session_timeout_s": config.zk_timeout_ms / 1000.0,
            **security_options(config.zk_digest_auth_path, config.zk_enable_security)}


__all__ = [
    "EventType",
    "MetadataServiceUri",
    "MetadataStore",
    "SessionState",
    "WatchEvent",
    "open_store",
    "security_options",
    "store_options",
    "parse_metadata_uri",
]
