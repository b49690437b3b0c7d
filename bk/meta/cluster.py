"""The cluster's znode layout under the ledgers root, and cluster initialisation.

`MetadataPaths(root)` names every fixed path of METADATA.md once; the managers
use it instead of building strings. `init_new_cluster` lays out a fresh root
the way BookKeeper's `initNewCluster` does: the root, `available/`,
`available/readonly/`, `cookies/`, `idgen/`, `underreplication/` with its
`ledgers/` and `locks/`, the `LAYOUT` text and, last, `INSTANCEID` (a uuid4):
creating INSTANCEID is the commit point, so of two racing initialisations
exactly one succeeds, and a half-done one can simply be run again.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass

from bk.errors import MetadataExistsError, MetadataFormatError, MetadataNotFoundError, MetadataStoreError
from bk.meta.store import MetadataStore, join_path, validate_path

LEDGER_MANAGER_CLASS = "org.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory"
LEDGER_MANAGER_VERSION = 1
LAYOUT_FORMAT_VERSION = 2
LAYOUT_DATA = f"{LAYOUT_FORMAT_VERSION}\n{LEDGER_MANAGER_CLASS}:{LEDGER_MANAGER_VERSION}".encode("ascii")


@dataclass(frozen=True)
class MetadataPaths:
    root: str

    def __post_init__(self) -> None:
        validate_path(self.root)

    def _p(self, *parts: str) -> str:
        return join_path(self.root, *parts)

    @property
    def instance_id(self) -> str:
        return self._p("INSTANCEID")

    @property
    def layout(self) -> str:
        return self._p("LAYOUT")

    @property
    def available(self) -> str:
        return self._p("available")

    @property
    def readonly(self) -> str:
        return self._p("available", "readonly")

    @property
    def cookies(self) -> str:
        return self._p("cookies")

    @property
    def idgen(self) -> str:
        return self._p("idgen")

    @property
    def underreplication(self) -> str:
        return self._p("underreplication")

    @property
    def ur_ledgers(self) -> str:
        return self._p("underreplication", "ledgers")

    @property
    def ur_locks(self) -> str:
        return self._p("underreplication", "locks")

    @property
    def auditor_election(self) -> str:
        return self._p("underreplication", "auditorelection")

    @property
    def replication_disable(self) -> str:
        return self._p("underreplication", "disable")

    @property
    def lost_bookie_recovery_delay(self) -> str:
        return self._p("underreplication", "lostBookieRecoveryDelay")

    def check_ctime(self, check: str) -> str:
        """The znode of an auditor check's last run: check is checkallledgers, placementpolicycheck
        or replicascheck (BookKeeper's names)."""
        return self._p("underreplication", f"{check}ctime")

    def writable_bookie(self, bookie_id: str) -> str:
        return self._p("available", check_bookie_id(bookie_id))

    def readonly_bookie(self, bookie_id: str) -> str:
        return self._p("available", "readonly", check_bookie_id(bookie_id))

    def cookie(self, bookie_id: str) -> str:
        return self._p("cookies", check_bookie_id(bookie_id))

    def structure(self) -> tuple[str, ...]:
        """The persistent directories a new cluster gets, parents first."""
        return (
            self.root,
            self.available,
            self.readonly,
            self.cookies,
            self.idgen,
            self.underreplication,
            self.ur_ledgers,
            self.ur_locks,
        )


def check_bookie_id(bookie_id: str) -> str:
    """A bookie id is one znode name, `host:port` by convention."""
    if (
        not isinstance(bookie_id, str)
        or not bookie_id
        or "/" in bookie_id
        or bookie_id in (".", "..", "readonly")
        or "\x00" in bookie_id
    ):
        raise MetadataStoreError(f"invalid bookie id {bookie_id!r}")
    return bookie_id


def paths_for(store: MetadataStore, root: str | None = None) -> MetadataPaths:
    return MetadataPaths(root or store.ledgers_root)


async def init_new_cluster(store: MetadataStore, root: str | None = None) -> str:
    """Lay out a new cluster; returns its instance id. Raises MetadataExistsError if
    the root is already initialised (it has an INSTANCEID)."""
    paths = paths_for(store, root)
    if await store.exists(paths.instance_id) is not None:
        raise MetadataExistsError(f"cluster at {paths.root} is already initialised")
    for path in paths.structure():
        await store.ensure_path(path)
    try:
        await store.create(paths.layout, LAYOUT_DATA)
    except MetadataExistsError:
        await read_layout(store, paths.root)  # someone else's: must be a layout we can use
    instance_id = str(uuid.uuid4())
    try:
        await store.create(paths.instance_id, instance_id.encode("ascii"))
    except MetadataExistsError:
        raise MetadataExistsError(f"cluster at {paths.root} is already initialised") from None
    return instance_id


async def is_initialized(store: MetadataStore, root: str | None = None) -> bool:
    return await store.exists(paths_for(store, root).instance_id) is not None


async def read_instance_id(store: MetadataStore, root: str | None = None) -> str:
    paths = paths_for(store, root)
    try:
        data, _ = await store.get(paths.instance_id)
    except MetadataNotFoundError:
        raise MetadataNotFoundError(
            f"cluster at {paths.root} is not initialised (no INSTANCEID); run init_new_cluster"
        ) from None
    return data.decode("utf-8", "replace").strip()


async def read_layout(store: MetadataStore, root: str | None = None) -> tuple[int, str, int]:
    """(layout format version, ledger manager class, manager version); only the
    hierarchical ledger manager is supported."""
    paths = paths_for(store, root)
    data, _ = await store.get(paths.layout)
    text = data.decode("utf-8", "replace")
    try:
        version_line, manager = text.strip().split("\n", 1)
        manager_class, manager_version = manager.strip().rsplit(":", 1)
        parsed = (int(version_line), manager_class, int(manager_version))
    except ValueError:
        raise MetadataFormatError(f"malformed LAYOUT at {paths.layout}: {text!r}") from None
    if parsed[1] != LEDGER_MANAGER_CLASS:
        raise MetadataFormatError(
            f"cluster at {paths.root} uses ledger manager {parsed[1]}; only {LEDGER_MANAGER_CLASS} is supported"
        )
    return parsed
