"""BookKeeper: the client entry point (create, open, delete, list ledgers).

    async with BookKeeper("zk://127.0.0.1:2181/ledgers") as bkc:     # or "mem://name/ledgers"
        lh = await bkc.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2,
                                     digest_type="CRC32C", password=b"secret")
        await lh.add_entry(b"payload")
        await lh.close()
        rh = await bkc.open_ledger(lh.ledger_id, password=b"secret")
        entries = await rh.read_entries(0, rh.last_add_confirmed)

One BookKeeper owns one metadata session (its store), one connection per
bookie (BookieClientPool) and the placement policy. Every ledger handle it
creates shares them; closing the BookKeeper fails whatever is still in flight.

The password and digest type are stored in the ledger metadata (as BookKeeper
does), so any client that knows the password can open or recover the ledger;
open_ledger checks the password against the stored one before talking to any
bookie.
"""
from __future__ import annotations

import hmac
import logging
import os
import weakref
from typing import Iterable, Mapping

from bk.errors import IncorrectParameterError, LedgerClosedError, LedgerExistsError, MetadataExistsError, UnauthorizedAccessError
from bk.meta import open_store
from bk.meta.ledger_manager import MAX_LEDGER_ID, LedgerManager
from bk.meta.ledger_metadata import DigestType as MetadataDigestType, LedgerMetadata
from bk.meta.registration import RegistrationManager
from bk.proto import DEFAULT_MAX_FRAME_SIZE_BYTES, DigestManager, DigestType, master_key, parse_digest_type

from .bookie_client import BookieClientPool
from .wire_v3 import ClientWireOptions
from .ledger_handle import LedgerHandle
from .ledger_handle_adv import LedgerHandleAdv
from .placement import EnsemblePlacementPolicy, PlacementSettings
from .quorum import check_quorum_sizes
from .read_handle import ReadHandle
from .recovery import recover_ledger
from .speculative import (
    DEFAULT_FIRST_SPECULATIVE_READ_LAC_TIMEOUT_MS, DEFAULT_MAX_SPECULATIVE_READ_LAC_TIMEOUT_MS,
    DEFAULT_SPECULATIVE_READ_LAC_TIMEOUT_BACKOFF_MULTIPLIER, DEFAULT_SPECULATIVE_READ_TIMEOUT_BACKOFF_MULTIPLIER,
    DEFAULT_SPECULATIVE_READ_TIMEOUT_MS, SpeculativePolicy, read_settings,
)

log = logging.getLogger(__name__)

DEFAULT_ADD_TIMEOUT_S = 10.0
DEFAULT_READ_TIMEOUT_S = 10.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_READ_WINDOW_ENTRIES = 256
# Entries per BATCH_READ when a segment has E == WQ (every bookie holds every entry).
DEFAULT_BATCH_READ_ENTRIES = 64


def _read_file(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read().strip()
    except OSError as e:
        raise IncorrectParameterError(f"cannot read {path}: {e}") from None


WRITE_FLAGS = frozenset({"DEFERRED_SYNC"})  # BookKeeper's WriteFlag values


def _write_flags(flags) -> frozenset:
    if isinstance(flags, str):
        flags = (flags,)
    try:
        names = frozenset(flags)
    except TypeError:
        raise IncorrectParameterError(f"write_flags must be a set of names, got {flags!r}") from None
    unknown = names - WRITE_FLAGS
    if unknown:
        raise IncorrectParameterError(f"unknown write flag(s) {sorted(map(str, unknown))}; known: {sorted(WRITE_FLAGS)}")
    return names


def _password(password) -> bytes:
    if isinstance(password, str):
        raise IncorrectParameterError("ledger passwords are bytes; encode the string first (BookKeeper uses UTF-8)")
    if not isinstance(password, (bytes, bytearray, memoryview)):
        raise IncorrectParameterError(f"password must be bytes, not {type(password).__name__}")
    return bytes(password)


class BookKeeper:
    def __init__(self, metadata_uri: str, *, add_timeout_s: float = DEFAULT_ADD_TIMEOUT_S,
                 read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
                 connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
                 read_window_entries: int = DEFAULT_READ_WINDOW_ENTRIES,
                 batch_read_entries: int = DEFAULT_BATCH_READ_ENTRIES,
                 speculative_read_timeout_ms: int = DEFAULT_SPECULATIVE_READ_TIMEOUT_MS,
                 first_speculative_read_timeout_ms: int | None = None,
                 max_speculative_read_timeout_ms: int | None = None,
                 speculative_read_timeout_backoff_multiplier: float =
                 DEFAULT_SPECULATIVE_READ_TIMEOUT_BACKOFF_MULTIPLIER,
                 first_speculative_read_lac_timeout_ms: int = DEFAULT_FIRST_SPECULATIVE_READ_LAC_TIMEOUT_MS,
                 max_speculative_read_lac_timeout_ms: int = DEFAULT_MAX_SPECULATIVE_READ_LAC_TIMEOUT_MS,
                 speculative_read_lac_timeout_backoff_multiplier: float =
                 DEFAULT_SPECULATIVE_READ_LAC_TIMEOUT_BACKOFF_MULTIPLIER,
                 sticky_reads_enabled: bool = False,
                 max_frame_size_bytes: int = DEFAULT_MAX_FRAME_SIZE_BYTES,
                 placement: EnsemblePlacementPolicy | None = None, store_options: Mapping | None = None,
                 # placement (bk/client/placement: PlacementSettings has what each means); BookKeeper's defaults
                 ensemble_placement_policy: str = "rackaware", min_num_racks_per_write_quorum: int = 2,
                 enforce_min_num_racks_per_write_quorum: bool = False, network_topology_script_file_name: str = "",
                 network_topology_script_number_args: int = 100, network_topology_mapping=None,
                 disk_weight_based_placement_enabled: bool = False,
                 bookie_max_weight_multiple_for_weight_based_placement: int = 3,
                 get_bookie_info_interval_seconds: int = 86400, reorder_read_sequence_enabled: bool = False,
                 repp_regions_to_write: str = "", repp_minimum_regions_for_durability: int = 2,
                 repp_enable_durability_enforcement_in_replace: bool = True, isolation_bookie_groups: str = "",
                 secondary_isolation_bookie_groups: str = "",
                 explicit_lac_interval_ms: int = 0,
                 delay_ensemble_change: bool = False, protocol: str = "v2", tls_trust_store: str | None = None,
                 tls_certificate_path: str | None = None, tls_key_store: str | None = None,
                 tls_hostname_verification: bool = True, auth_token: str | None = None, auth_plugin=None,
                 sasl_jaas_config_path: str | None = None, sasl_jaas_client_section_name: str = "BookKeeper"):
        # Unset credentials fall back to the environment (BK_CLIENT_AUTH_TOKEN, BK_CLIENT_TLS_TRUST_STORE,
        # BK_CLIENT_TLS_CERTIFICATE_PATH, BK_CLIENT_TLS_KEY_STORE), as ZooKeeper's do to BK_ZK_*: so
        # `bk shell` and scripts reach bookies that require a token or TLS without new options each.
        auth_token = auth_token if auth_token is not None else os.environ.get("BK_CLIENT_AUTH_TOKEN") or None
        tls_trust_store = tls_trust_store or os.environ.get("BK_CLIENT_TLS_TRUST_STORE") or None
        tls_certificate_path = tls_certificate_path or os.environ.get("BK_CLIENT_TLS_CERTIFICATE_PATH") or None
        tls_key_store = tls_key_store or os.environ.get("BK_CLIENT_TLS_KEY_STORE") or None
        # BookKeeper's SASL plugin (DIGEST-MD5): username/password from the JAAS file's client section,
        # as SASLClientProviderFactory reads them (bk/proto/sasl.py); BK_CLIENT_SASL_JAAS_CONFIG_PATH else
        sasl_jaas_config_path = sasl_jaas_config_path or os.environ.get("BK_CLIENT_SASL_JAAS_CONFIG_PATH") or None
        if sasl_jaas_config_path and auth_plugin is None and auth_token is None:
            from bk.errors import ConfigError
            from bk.proto.sasl import SaslClientProvider, client_credentials

            try:
                user, secret = client_credentials(sasl_jaas_config_path, sasl_jaas_client_section_name)
            except ConfigError as e:
                raise IncorrectParameterError(str(e)) from None
            auth_plugin = lambda: SaslClientProvider(user, secret)  # noqa: E731  (one exchange per connection)
        for name, value in (("add_timeout_s", add_timeout_s), ("read_timeout_s", read_timeout_s),
                            ("connect_timeout_s", connect_timeout_s)):
            if not value > 0:
                raise IncorrectParameterError(f"{name} must be > 0, got {value!r}")
        if read_window_entries < 1:
            raise IncorrectParameterError(f"read_window_entries must be >= 1, got {read_window_entries!r}")
        self.metadata_uri = metadata_uri
        self.add_timeout_s = float(add_timeout_s)
        self.read_timeout_s = float(read_timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.read_window_entries = int(read_window_entries)
        self.batch_read_entries = int(batch_read_entries)  # 0 or 1: never BATCH_READ
        # Speculative reads (bk/client/speculative.py; None = off) and sticky reads (read_handle.py),
        # BookKeeper's settings and defaults: first/max entry-read timeouts default to speculative_read_timeout_ms.
        first, most = first_speculative_read_timeout_ms, max_speculative_read_timeout_ms
        self.speculative_read_policy = SpeculativePolicy.build(
            "speculative read", speculative_read_timeout_ms if first is None else first,
            speculative_read_timeout_ms if most is None else most, speculative_read_timeout_backoff_multiplier)
        self.speculative_read_lac_policy = SpeculativePolicy.build(
            "speculative read LAC", first_speculative_read_lac_timeout_ms, max_speculative_read_lac_timeout_ms,
            speculative_read_lac_timeout_backoff_multiplier)
        self.sticky_reads_enabled = bool(sticky_reads_enabled)
        self.max_frame_size_bytes = int(max_frame_size_bytes)
        if placement is None:
            values = locals()
            placement = EnsemblePlacementPolicy.from_settings(
                PlacementSettings(**{name: values[name] for name in PlacementSettings.names()}))
        self.placement = placement
        # BookKeeper's delayEnsembleChange (off by default, as there): a writer keeps a failed bookie
        # in the ensemble while every write set still has AQ bookies up (LedgerHandle's docstring).
        # Ledger recovery's write-back always does this.
        self.delay_ensemble_change = bool(delay_ensemble_change)
        # BookKeeper's explicitLacInterval (ms, 0 = off): an idle writer sends WRITE_LAC (explicit_lac.py)
        if isinstance(explicit_lac_interval_ms, bool) or not isinstance(explicit_lac_interval_ms, int) \
                or explicit_lac_interval_ms < 0:
            raise IncorrectParameterError(
                f"explicit_lac_interval_ms must be an int >= 0, got {explicit_lac_interval_ms!r}")
        self.explicit_lac_interval_ms = explicit_lac_interval_ms
        # The bookie connections' protocol, TLS and AUTH (bk/client/wire_v3.py): v2 by default (faster
        # here, docs/BENCHMARKS.md); TLS when a trust store or a client certificate is given (PEM files,
        # hostname verification on); auth_token presents a token to bookies running the bk-token plugin.
        try:
            self.wire = ClientWireOptions.build(
                protocol=protocol, tls_trust_store=tls_trust_store, tls_certificate_path=tls_certificate_path,
                tls_key_store=tls_key_store, tls_hostname_verification=tls_hostname_verification,
                auth_token=auth_token, auth_plugin=auth_plugin)
        except (ValueError, OSError) as e:
            raise IncorrectParameterError(f"bad protocol/TLS/auth option: {e}") from None
        self._store_options = dict(store_options or {})
        self.store = None
        self.ledger_manager: LedgerManager | None = None
        self.registration: RegistrationManager | None = None
        self.pool: BookieClientPool | None = None
        self._closed = False
        self._adv_writers = weakref.WeakSet()  # create_ledger_adv's open handles (close() fails their adds)

    # ------------------------------------------------------------ lifecycle
    @classmethod
    def for_bookie(cls, config, **options) -> "BookKeeper":
        """The client a bookie process uses for itself (AutoRecovery, BP-46 repair, HTTP admin):
        its metadata URI, frame limit and ZooKeeper security, and its own credentials towards
        its peers: with the token plugin, the shared secret, or a token it signs for its own id
        with the secret key; with TLS, its certificate and trust store (mutual TLS)."""
        from bk.meta import store_options
        from bk.proto.auth import sign_token

        kwargs: dict = {"max_frame_size_bytes": config.max_frame_size_bytes, "store_options": store_options(config)}
        kwargs.update(PlacementSettings.from_config(config).kwargs())
        kwargs.update(read_settings(config))
        kwargs["explicit_lac_interval_ms"] = config.explicit_lac_interval_ms
        if config.bookie_auth_provider == "token":
            if config.auth_token_shared_secret_path:
                kwargs["auth_token"] = _read_file(config.auth_token_shared_secret_path).decode()
            elif config.auth_token_secret_key_path:
                kwargs["auth_token"] = sign_token(config.bookie_id, _read_file(config.auth_token_secret_key_path))
        elif config.bookie_auth_provider == "sasl":  # BookKeeper's clientRole=system: the Auditor section
            kwargs.update(sasl_jaas_config_path=config.sasl_jaas_config_path,
                          sasl_jaas_client_section_name=config.sasl_jaas_auditor_section_name)
        if config.tls_certificate_path and config.tls_key_store:
            kwargs.update(tls_certificate_path=config.tls_certificate_path, tls_key_store=config.tls_key_store,
                          tls_trust_store=config.tls_trust_store or None)
        return cls(config.metadata_service_uri, **{**kwargs, **options})

    @classmethod
    async def connect(cls, metadata_uri: str, **options) -> "BookKeeper":
        return await cls(metadata_uri, **options).start()

    async def start(self) -> "BookKeeper":
        if self.store is not None:
            return self
        self.store = await open_store(self.metadata_uri, **self._store_options)
        self.ledger_manager = LedgerManager(self.store)
        self.registration = RegistrationManager(self.store, reregister_on_expiry=False)
        self.pool = BookieClientPool(add_timeout_s=self.add_timeout_s, read_timeout_s=self.read_timeout_s,
                                     connect_timeout_s=self.connect_timeout_s,
                                     max_frame_size_bytes=self.max_frame_size_bytes, wire=self.wire)
        self.placement.bind(store=self.store, pool=self.pool, registration=self.registration)
        if self.placement.settings.reorder_read_sequence_enabled:  # read_ops.order_replicas asks it
            self.pool.read_order = self.placement.reorder_read_sequence
        return self

    async def close(self) -> None:
        """Drop every bookie connection (failing what is in flight) and the metadata session."""
        if self._closed:
            return
        self._closed = True
        for lh in list(self._adv_writers):  # adds stuck behind an id never added have no request to fail
            lh._fail(LedgerClosedError, f"ledger {lh.ledger_id}: its BookKeeper client was closed")
        if self.pool is not None:
            self.pool.close()
        if self.registration is not None:
            await self.registration.close()
        if self.store is not None:
            await self.store.close()

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> "BookKeeper":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _check_started(self) -> None:
        if self._closed:
            raise IncorrectParameterError("this BookKeeper client is closed")
        if self.store is None:
            raise IncorrectParameterError("BookKeeper client not started: use `async with` or BookKeeper.connect()")

    # ------------------------------------------------------------ ledgers
    async def create_ledger(self, ensemble_size: int = 3, write_quorum_size: int = 2, ack_quorum_size: int = 2,
                            digest_type="CRC32C", password: bytes = b"",
                            custom_metadata: Mapping[str, bytes] | None = None, *,
                            write_flags: Iterable[str] = ()) -> LedgerHandle:
        """A new OPEN ledger on `ensemble_size` writable bookies the placement policy chose, ready for adds.

        `write_flags` are BookKeeper's WriteFlag names: {"DEFERRED_SYNC"} makes adds acknowledged
        before the bookies' journal fsync, the LAC moving only on `await lh.force()`
        (LedgerHandle's docstring). The ledger metadata does not record them (as BookKeeper's)."""
        return await self._create(LedgerHandle, None, ensemble_size, write_quorum_size, ack_quorum_size,
                                  digest_type, password, custom_metadata, write_flags)

    async def create_ledger_adv(self, ensemble_size: int = 3, write_quorum_size: int = 2, ack_quorum_size: int = 2,
                                digest_type="CRC32C", password: bytes = b"",
                                custom_metadata: Mapping[str, bytes] | None = None, *, ledger_id: int | None = None,
                                write_flags: Iterable[str] = ()) -> LedgerHandleAdv:
        """Like create_ledger, but the caller gives each entry id: `await lh.add_entry(entry_id, data)`
        (BookKeeper's createLedgerAdv; bk/client/ledger_handle_adv.py). With `ledger_id` the ledger
        gets that id (LedgerExistsError if it is taken), else a generated one."""
        if ledger_id is not None and (isinstance(ledger_id, bool) or not isinstance(ledger_id, int)
                                      or not 0 <= ledger_id <= MAX_LEDGER_ID):
            raise IncorrectParameterError(f"ledger_id must be an int in 0..{MAX_LEDGER_ID}, got {ledger_id!r}")
        return await self._create(LedgerHandleAdv, ledger_id, ensemble_size, write_quorum_size, ack_quorum_size,
                                  digest_type, password, custom_metadata, write_flags)

    async def _create(self, handle_class, ledger_id, ensemble_size, write_quorum_size, ack_quorum_size,
                      digest_type, password, custom_metadata, write_flags):
        self._check_started()
        check_quorum_sizes(ensemble_size, write_quorum_size, ack_quorum_size)
        dtype = parse_digest_type(digest_type)
        password = _password(password)
        write_flags = _write_flags(write_flags)
        writable = await self.registration.writable_bookies()
        await self.placement.on_cluster_changed(writable)  # racks (and free space) of new bookies
        ensemble = self.placement.new_ensemble(ensemble_size, writable, write_quorum_size=write_quorum_size,
                                               ack_quorum_size=ack_quorum_size, custom_metadata=custom_metadata)
        metadata = LedgerMetadata.new(ensemble, write_quorum_size, ack_quorum_size,
                                      digest_type=MetadataDigestType(int(dtype)), password=password,
                                      custom_metadata=dict(custom_metadata or {}))
        if ledger_id is not None:  # chosen (create_ledger_adv)
            try:
                version = await self.ledger_manager.create_ledger_metadata(ledger_id, metadata)
            except MetadataExistsError:
                raise LedgerExistsError(f"ledger {ledger_id} exists already (it has metadata)") from None
        while ledger_id is None:
            ledger_id = await self.ledger_manager.generate_ledger_id()
            try:
                version = await self.ledger_manager.create_ledger_metadata(ledger_id, metadata)
            except MetadataExistsError:  # an id taken by a ledger created with an explicit id
                log.warning("ledger id %d already has metadata; generating another", ledger_id)
                ledger_id = None
        digest = DigestManager(ledger_id, dtype, password)
        handle = handle_class(self, ledger_id, metadata, version, digest, master_key(password), write_flags=write_flags)
        if handle_class is LedgerHandleAdv:
            self._adv_writers.add(handle)
        return handle

    async def open_ledger(self, ledger_id: int, password: bytes = b"", *, recovery: bool = True,
                          digest_type=None) -> ReadHandle:
        """A handle for reading ledger `ledger_id`.

        recovery=True is the default, as in BookKeeper's openLedger: a reader
        that opens a ledger whose writer may be dead gets a closed, final ledger.

        recovery=False never fences and never changes the metadata: an open
        ledger is read up to the LAC its bookies report (a tailing reader).
        recovery=True fences the ledger and closes it at the end its bookies
        agree on (REPLICATION.md, ledger recovery; bk.client.recovery), so the
        handle reads a CLOSED ledger; LedgerRecoveryError if the bookies'
        answers cannot decide (retry later), and the ledger stays IN_RECOVERY.

        A wrong password (checked against the one in the metadata) raises
        UnauthorizedAccessError before any bookie is contacted. `digest_type`
        is only used for ledgers whose metadata does not name one."""
        self._check_started()
        password = _password(password)
        metadata, version = await self.ledger_manager.read_ledger_metadata(ledger_id)
        if metadata.password is not None and not hmac.compare_digest(metadata.password, password):
            raise UnauthorizedAccessError(f"wrong password for ledger {ledger_id}", ledger_id=ledger_id)
        if metadata.digest_type is not None:
            dtype = DigestType(int(metadata.digest_type))
        else:
            dtype = parse_digest_type(digest_type if digest_type is not None else "CRC32C")
        digest = DigestManager(ledger_id, dtype, password)
        if recovery and not metadata.is_closed:
            metadata, version = await recover_ledger(self, ledger_id, digest, master_key(password))
        handle = ReadHandle(self, ledger_id, metadata, version, digest, master_key(password))
        if not metadata.is_closed:
            await handle.read_last_add_confirmed()
        return handle

    async def delete_ledger(self, ledger_id: int) -> None:
        """Remove the ledger's metadata (bookies drop its entries in their garbage collection)."""
        self._check_started()
        await self.ledger_manager.remove_ledger_metadata(ledger_id)

    async def list_ledgers(self) -> list[int]:
        """Every ledger id in the cluster, ascending."""
        self._check_started()
        return await self.ledger_manager.list_ledger_ids()

    async def get_ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        self._check_started()
        metadata, _ = await self.ledger_manager.read_ledger_metadata(ledger_id)
        return metadata
