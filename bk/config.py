"""Bookie settings: one frozen dataclass, loaded from TOML + environment + --set.

Precedence (lowest to highest): defaults, the TOML file (flat snake_case keys),
environment variables `BK_<KEY>` (upper case), then `--set key=value` pairs.
Unknown keys and bad values raise `ConfigError` naming the key. Sizes accept
suffixes (`64MiB`, `1GiB`, `512KiB`, `10MB`); lists accept a TOML list in the
file or a comma-separated string elsewhere.
"""
from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Mapping

from bk.errors import ConfigError

KiB, MiB, GiB = 1024, 1024 * 1024, 1024 * 1024 * 1024


@dataclass(frozen=True)
class BookieConfig:
    # --- identity and metadata
    metadata_service_uri: str = "zk://127.0.0.1:2181/ledgers"
    bookie_port: int = 3181
    advertised_address: str = "127.0.0.1"
    bind_address: str = ""  # empty: bind to advertised_address
    # BookKeeper's zkTimeout: the bookie's ZooKeeper session timeout. After a crash the restarted
    # bookie registers once the dead process's session expired, so this bounds that wait too.
    zk_timeout_ms: int = 10_000

    # --- directories
    journal_dirs: tuple[str, ...] = ("data/journal",)
    ledger_dirs: tuple[str, ...] = ("data/ledgers",)
    index_dir: str = ""  # empty: <first ledger dir>/current/index

    # --- journal
    journal_write_data: bool = True  # false = BP-46 journal-off: entries skip the journal
    journal_sync_data: bool = True  # false = no fsync (acks after write(); unsafe)
    journal_max_group_wait_ms: float = 2.0
    journal_buffered_writes_threshold_bytes: int = 512 * KiB
    # True (BookKeeper's default is false): this journal fsyncs in its writer thread, so a group
    # wait cannot overlap the previous group's fsync as it does beside BookKeeper's separate
    # force-write thread; writing as soon as the queue drains lets the next group gather during
    # the fsync instead (docs/BENCHMARKS.md: 100 B adds at 1000 in flight 115-129k -> 240k/s).
    journal_flush_when_queue_empty: bool = True
    journal_max_size_bytes: int = 2 * GiB
    # BookKeeper's journalRemovePagesFromCache: drop journal pages from the page cache once
    # fsynced (only replay reads them). Fresh page-cache pages are expensive to fill; reused
    # ones are not: measured 2.1 -> 0.6 us of CPU per KiB written (BENCHMARKS.md).
    journal_remove_pages_from_cache: bool = True
    # A journal written in place (STORAGE.md, "Journal files"): format 2 preallocates each
    # file in steps of journal_pre_alloc_size_mb (zeros written and fsynced at once, so a
    # group's fdatasync commits no file size or block allocation) and pads every group to
    # journal_alignment_size. 1 writes the old appended format (read either way).
    # journal_reuse_files: a journal file behind the checkpoint is renamed and written over
    # as a later file (no zeroing); BookKeeper's names and defaults.
    journal_format_version_to_write: int = 2
    journal_pre_alloc_size_mb: int = 16
    journal_alignment_size: int = 512
    journal_reuse_files: bool = False

    # --- ledger storage
    entry_log_size_limit_bytes: int = 1 * GiB
    # BookKeeper's flushEntrylogBytes: fdatasync the entry log every this many bytes a
    # checkpoint writes (0 = only at its end, BookKeeper's default). A whole checkpoint
    # queued on the disk at once holds up a journal fsync on the same disk for tens of ms:
    # 1 MiB steps cut the p99 add latency at 50k 1 KiB adds/s from 65 to 15 ms, 256 KiB
    # steps the p99 at 75k from 12-13 to 6.6-8 ms with the same peak; 128 KiB fell behind
    # at the peak (BENCHMARKS.md). While a checkpoint falls behind the adds the steps grow
    # to 2 MiB (bk/entrylog/logger.py). Not applied with journal_write_data = false: no
    # add then waits on a journal fsync.
    entry_log_flush_bytes: int = 256 * KiB
    # Drop a checkpoint's synced entry-log pages from the page cache (BookKeeper keeps them).
    # Writing into fresh page-cache pages costs ~2 us of CPU per KiB here: journal-off 64 KiB
    # adds 253-313 -> 367-437 MB/s. Reading a flushed ledger back then comes from the disk
    # (with read-ahead): 65k and 91k 1 KiB entries/s against 57k and 59k keeping the pages
    # (alternated runs: no loss seen). false keeps them, as BookKeeper.
    entry_log_remove_pages_from_cache: bool = True
    write_cache_max_size_bytes: int = 64 * MiB
    write_cache_full_wait_ms: int = 10_000  # adds wait this long for space, then ETOOMANYREQUESTS (BookKeeper: 10 s)
    read_cache_max_size_bytes: int = 64 * MiB
    read_ahead_batch_size: int = 100
    flush_interval_ms: int = 1000
    index_map_size_bytes: int = 1 * GiB
    index_sync: bool = True
    # Threads for reads that miss both caches (BookKeeper's default, 8): they wait on the
    # disk, so more of them keep more reads in flight; 2 held random cold 64 KiB reads to
    # 315-335 MB/s where 8 read 400-470 (docs/BENCHMARKS.md, seventh round); 32 read 480-556
    # (eighth round). With read_io's ring they serve only read-ahead runs and BATCH_READ spans.
    num_read_worker_threads: int = 8
    # How single-entry READs reach the entry logs: "ring" (io_uring from the event loop,
    # bk/bookie/read_ring.py), "threads" (a pread in a read thread, as BookKeeper does), or
    # "auto": the ring where this machine allows it. Cold random 64 KiB READs, one bookie,
    # 8 read slots (rand.py): ring 549-664 MB/s, threads 496-539 (docs/BENCHMARKS.md,
    # twelfth round). With the ring the index lookups of these reads run on the loop.
    read_io: str = "auto"

    # --- server
    max_frame_size_bytes: int = 5 * MiB
    max_pending_requests_per_connection: int = 10_000
    max_pending_bytes_per_connection: int = 64 * MiB
    # BookKeeper's shutdown timeout: a SIGTERM'd bookie (or `bk autorecovery`) has left by
    # then whatever ZooKeeper, peers or a disk do; a stop that had to abandon the final
    # checkpoint exits non-zero with the unclean-shutdown flag set (docs/OPERATIONS.md)
    shutdown_timeout_ms: int = 30_000

    # --- disks
    disk_usage_threshold: float = 0.95
    disk_usage_lwm_threshold: float = 0.90
    disk_check_interval_ms: int = 10_000

    # --- autorecovery
    autorecovery_enabled: bool = False
    lost_bookie_recovery_delay_s: int = 0
    auditor_periodic_check_interval_s: int = 604_800
    auditor_periodic_bookie_check_interval_s: int = 86_400
    # auditorPeriodicPlacementPolicyCheckInterval (0 = off, BookKeeper's default): the Auditor counts the
    # closed ledgers whose segments break the placement policy; with repairedPlacementPolicyNotAdheringBookieEnable
    # it marks them under-replicated and replication workers move them (docs/PLACEMENT.md)
    auditor_periodic_placement_policy_check_interval_s: int = 0
    repaired_placement_policy_not_adhering_bookie_enable: bool = False
    open_ledger_rereplication_grace_period_ms: int = 30_000
    rereplication_entry_batch_size: int = 100
    replication_rate_bytes_per_s: int = 0
    # `bk autorecovery`'s own /metrics (the bookie serves its on http_server_port): -1 off,
    # 0 any free port (printed at start), else that port, on http_server_address (empty: 127.0.0.1)
    autorecovery_metrics_port: int = -1
    # The bookie's own client (AutoRecovery, BP-46 repair): BookKeeper's client read settings, as the
    # keyword arguments of BookKeeper(...) (bk/client/speculative.py); -1 = speculative_read_timeout_ms.
    speculative_read_timeout_ms: int = 2000  # speculativeReadTimeout; 0 = no speculative reads
    first_speculative_read_timeout_ms: int = -1  # firstSpeculativeReadTimeout
    max_speculative_read_timeout_ms: int = -1  # maxSpeculativeReadTimeout
    speculative_read_timeout_backoff_multiplier: float = 2.0  # speculativeReadTimeoutBackoffMultiplier
    first_speculative_read_lac_timeout_ms: int = 1500  # firstSpeculativeReadLACTimeout; 0 = off
    max_speculative_read_lac_timeout_ms: int = 5000  # maxSpeculativeReadLACTimeout
    speculative_read_lac_timeout_backoff_multiplier: float = 2.0  # speculativeReadLACTimeoutBackoffMultiplier
    sticky_reads_enabled: bool = False  # stickyReadsEnabled
    explicit_lac_interval_ms: int = 0  # explicitLacInterval: an idle writer's WRITE_LAC period; 0 = off

    # The bookie's own client's placement policy (bk/client/placement, docs/CLIENT.md): BookKeeper's
    # ClientConfiguration keys and defaults, the keyword arguments of BookKeeper(...) of the same names.
    ensemble_placement_policy: str = "rackaware"  # ensemblePlacementPolicy: rackaware, regionaware, default
    min_num_racks_per_write_quorum: int = 2  # minNumRacksPerWriteQuorum
    enforce_min_num_racks_per_write_quorum: bool = False  # enforceMinNumRacksPerWriteQuorum
    network_topology_script_file_name: str = ""  # networkTopologyScriptFileName (ScriptBasedMapping)
    network_topology_script_number_args: int = 100  # networkTopologyScriptNumberArgs
    network_topology_mapping: str = ""  # bk: file of a static bookie -> /region/rack mapping
    disk_weight_based_placement_enabled: bool = False  # diskWeightBasedPlacementEnabled
    bookie_max_weight_multiple_for_weight_based_placement: int = 3  # bookieMaxWeightMultipleForWeightBasedPlacement
    get_bookie_info_interval_seconds: int = 86400  # getBookieInfoIntervalSeconds
    reorder_read_sequence_enabled: bool = False  # reorderReadSequenceEnabled
    repp_regions_to_write: str = ""  # reppRegionsToWrite: "region1;region2;..."
    repp_minimum_regions_for_durability: int = 2  # reppMinimumRegionsForDurability
    repp_enable_durability_enforcement_in_replace: bool = True  # reppEnableDurabilityEnforcementInReplace
    isolation_bookie_groups: str = ""  # Pulsar's isolationBookieGroups: "group1,group2"
    secondary_isolation_bookie_groups: str = ""  # Pulsar's secondaryIsolationBookieGroups
    # This bookie's own location and isolation group, published as its registration properties `rack`
    # and `group` (clients read them when no mapping or script places the bookie; bk's, not BookKeeper's).
    bookie_rack: str = ""  # e.g. "/region1/rack2"
    bookie_isolation_group: str = ""

    # --- BP-46: running without the journal (REPLICATION.md, "Running without the journal")
    # None = auto: on exactly when journal_write_data is false (then a crash can lose acknowledged
    # entries and fences, and the boot-time check and self-repair are what keep the cluster safe).
    data_integrity_checking_enabled: bool | None = None
    # A bookie whose directories lost their cookies (a replaced or wiped disk) stamps new ones
    # itself after phase one is durable; false = it refuses to start and names `bk shell fixcookie`.
    data_integrity_cookie_stamping_enabled: bool = False
    data_integrity_repair_parallel_ledgers: int = 4  # ledgers repaired at once (phase two)
    data_integrity_repair_rate_bytes_per_s: int = 0  # bytes copied from peers per second; 0 = no limit
    data_integrity_repair_retry_max_s: float = 60.0  # backoff cap between attempts on a ledger

    # --- operations: HTTP admin server, metrics, logs (issue 15; docs/OPERATIONS.md)
    http_server_enabled: bool = True
    # BookKeeper's httpServerPort is 8000, which Pulsar's and ZooKeeper's metrics also use
    # by default; bk takes 8180 (0 = an ephemeral port, for tests). A port another process
    # holds is a WARNING and no HTTP server, the bookie serves (docs/OPERATIONS.md).
    http_server_port: int = 8180
    # empty = loopback (127.0.0.1) only; any other address needs http_server_token or
    # http_server_tls_enable with tls_client_authentication, else the bookie refuses to start
    http_server_address: str = ""
    http_server_tls_enable: bool = False  # httpServerTlsEnable: HTTPS with the bookie's tls_* files
    http_server_mutations_enabled: bool = False  # PUT/DELETE endpoints answer 403 unless true
    http_server_token: str = ""  # when set, "Authorization: Bearer <token>" is required (not on probes)
    metrics_enabled: bool = True  # false: recording is a no-op (the page stays, frozen)
    # latencies on /metrics: "summary" = BookKeeper's Prometheus provider ({quantile="0.99"}),
    # "histogram" = <name>_bucket{le=...} for histogram_quantile() (docs/OPERATIONS.md)
    prometheus_latency_shape: str = "summary"
    log_file: str = ""  # empty: stderr
    # "INFO", or a root level and per-logger levels: "INFO,bk.journal=DEBUG,kazoo=WARNING"
    log_level: str = "INFO"
    log_format: str = "text"  # text | json (one JSON object a line)
    log_file_max_size_bytes: int = 100 * MiB  # rotate log_file at this size (0 = never)
    log_file_backups: int = 5

    # --- garbage collection, compaction, read-only mode, admin channel (docs/GC.md)
    gc_wait_time_ms: int = 900_000  # BookKeeper's gcWaitTime: between two GC passes
    # BookKeeper's gcOverreplicatedLedgerWaitTime: how often the over-replication check
    # runs (0 = never); a copy is deleted only when no ensemble of the closed ledger
    # names this bookie any more.
    gc_over_replicated_ledger_wait_time_ms: int = 86_400_000
    verify_metadata_on_gc: bool = True  # re-read a candidate's metadata just before deleting it
    gc_metadata_timeout_ms: int = 30_000  # one metadata call of a pass (its metadata phase: 10 of them)
    # BookKeeper's gcOverreplicatedLedgerMaxConcurrentRequests: metadata reads GC has in flight at
    # once, and the batch it verifies and then deletes (the scan's candidates, the over-replication check)
    gc_over_replicated_ledger_max_concurrent_requests: int = 1000
    minor_compaction_threshold: float = 0.2  # compact logs under 20% live ... (0 = no minor compaction)
    minor_compaction_interval_s: int = 3600  # ... every hour (0 = no minor compaction)
    major_compaction_threshold: float = 0.8
    major_compaction_interval_s: int = 86_400
    # Record bytes compaction copies per second (0 = unthrottled; BookKeeper: 1 MB/s). Adds
    # next to a compaction (bench.gc, BENCHMARKS.md), 1 KiB: unthrottled -50%, 64 MiB/s -28%,
    # 16 MiB/s -19%; 4 KiB at 64 MiB/s -8%. 16 MiB/s rewrites 32 GiB in ~35 minutes.
    compaction_rate_bytes_per_s: int = 16 * MiB
    # BookKeeper's isForceGCAllowWhenNoSpace: with every ledger dir over disk_usage_threshold,
    # run GC and compaction at once (and keep compacting) so the bookie can leave read-only
    # mode by itself; false suspends compaction while the disks are full (GC still runs).
    is_force_gc_allow_when_no_space: bool = False
    force_read_only: bool = False  # serve reads only, from the start (BookKeeper's forceReadOnlyBookie)
    # The admin channel of `bk shell triggergc/gcstatus`: a Unix-domain socket, JSON lines.
    # Empty path: <first ledger dir>/admin.sock. Access is the socket file's permissions.
    admin_socket_enabled: bool = True
    admin_socket_path: str = ""

    # --- protocol: v3, authentication, TLS (issue 16; docs/PROTOCOL-EXTENSIONS.md)
    # "" = authentication off (AUTH answered as BookKeeper's AuthDisabledPlugin); "token" = bk's token
    # plugin (bk/proto/auth.py): HS256 tokens signed with the key in auth_token_secret_key_path,
    # and/or the shared secret in auth_token_shared_secret_path. BookKeeper: bookieAuthProviderFactoryClass.
    bookie_auth_provider: str = ""
    auth_token_secret_key_path: str = ""
    auth_token_shared_secret_path: str = ""
    # "sasl" = BookKeeper's SASLBookieAuthProviderFactory (DIGEST-MD5; bk/proto/sasl.py): users from the
    # JAAS file (BookKeeper's -Djava.security.auth.login.config) section sasl_jaas_bookie_section_name
    # (user_<name>="<password>"); the bookie's own client logs in with sasl_jaas_auditor_section_name.
    sasl_jaas_config_path: str = ""
    sasl_jaas_bookie_section_name: str = "Bookie"  # saslJaasBookieSectionName
    sasl_jaas_auditor_section_name: str = "Auditor"  # saslJaasAuditorSectionName
    sasl_jaas_client_allowed_ids: str = ".*bookkeeper.*"  # saslJaasClientAllowedIds: whole-match regex
    # TLS on START_TLS (BookKeeper's tls* settings; stores are PEM files). On when both the certificate
    # and the key are set.
    tls_provider: str = "OpenSSL"  # Python's ssl module (OpenSSL) whatever the value; JDK is refused
    tls_certificate_path: str = ""  # tlsCertificatePath: the bookie's PEM certificate chain
    tls_key_store_type: str = "PEM"  # tlsKeyStoreType: only PEM
    tls_key_store: str = ""  # tlsKeyStore: the bookie's PEM private key
    tls_key_store_password_path: str = ""  # tlsKeyStorePasswordPath: password of an encrypted key
    tls_trust_store_type: str = "PEM"  # tlsTrustStoreType: only PEM
    tls_trust_store: str = ""  # tlsTrustStore: PEM CAs that sign client certificates
    tls_client_authentication: bool = False  # tlsClientAuthentication: require a client certificate (mTLS)
    # tlsCertFilesRefreshDurationSeconds: reload changed certificate/key/trust files this often (0 = never)
    tls_cert_files_refresh_duration_s: int = 0
    # ZooKeeper: digest credentials ("user:password" in this file) for every session of the bookie
    # and its AutoRecovery; zk_enable_security (BookKeeper's zkEnableSecurity) gives the znodes bk
    # creates the ACL CREATOR_ALL. Also read from BK_ZK_DIGEST_AUTH_PATH / BK_ZK_ENABLE_SECURITY by
    # every bk process (shell, clients) that opens a store without explicit options.
    zk_digest_auth_path: str = ""
    zk_enable_security: bool = False

    # --- overload (issue 17; docs/OVERLOAD.md)
    # Answers one connection may leave unwritten (queued in the bookie or in its transport)
    # when the client does not read them: above this its requests are no longer read, and
    # reads carrying entries wait (at most max_reads_in_progress_per_connection of them per
    # connection read meanwhile), so a connection holds at most this plus one entry per read slot.
    max_response_bytes_per_connection: int = 4 * MiB
    # Reads answering with entries that one connection has under way at once (its read slots);
    # more wait in arrival order. Their depth is the disk's queue for one reader: 8 held cold
    # random 64 KiB READs through the ring to 549-664 MB/s, 32 to 817-842 (docs/BENCHMARKS.md,
    # twelfth round). Till then the read slots were num_read_worker_threads (8).
    max_reads_in_progress_per_connection: int = 32
    # Bookie-wide limits (issue 27), over every connection at once; 0 = unlimited (BookKeeper's
    # default for its two). Adds counted from arrival to answer (BookKeeper's
    # maxAddsInProgressLimit), their body bytes likewise, reads likewise (maxReadsInProgressLimit):
    # at the limit the bookie stops reading its sockets (BookKeeper: channel autoread off) and
    # reads again at half; what arrives beyond twice the limit is answered ETOOMANYREQUESTS.
    # Defaults bound memory whatever the number of connections (docs/OVERLOAD.md).
    max_adds_in_progress_limit: int = 50_000
    max_add_bytes_in_progress_limit: int = 64 * MiB
    max_reads_in_progress_limit: int = 50_000
    # v3 long polls parked on a ledger's LAC at once (~1.5 KiB each, docs/OVERLOAD.md); more are
    # answered ETOOMANYREQUESTS (BookKeeper has no such limit). 0 = unlimited.
    max_long_polls: int = 10_000
    # The bookie raises its soft open-files limit (RLIMIT_NOFILE) to the hard limit at start
    # (each connection is one descriptor) and logs both; false leaves the limit as inherited.
    raise_open_files_limit: bool = True

    @property
    def bookie_id(self) -> str:
        return f"{self.advertised_address}:{self.bookie_port}"

    @property
    def data_integrity_checking(self) -> bool:
        """data_integrity_checking_enabled with `auto` resolved (see the setting)."""
        if self.data_integrity_checking_enabled is None:
            return not self.journal_write_data
        return self.data_integrity_checking_enabled

    @property
    def resolved_admin_socket_path(self) -> str:
        return self.admin_socket_path or os.path.join(self.ledger_dirs[0], "admin.sock")

    @property
    def resolved_index_dir(self) -> str:
        return self.index_dir or os.path.join(self.ledger_dirs[0], "current", "index")

    def replace(self, **changes: Any) -> "BookieConfig":
        return load_config(overrides={**{k: v for k, v in changes.items()}}, base=self)


_FIELDS = {f.name: f for f in fields(BookieConfig)}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|[KMGT]|B)?\s*$", re.IGNORECASE)
_SIZE_MULT = {"": 1, "B": 1, "K": KiB, "M": MiB, "G": GiB, "T": 1024 * GiB,
              "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4,
              "KIB": KiB, "MIB": MiB, "GIB": GiB, "TIB": 1024 * GiB}


def _convert(key: str, value: Any) -> Any:
    f = _FIELDS[key]
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    try:
        if kind == "bool | None":  # a switch whose unset value means "auto"
            if value is None or str(value).strip().lower() in ("auto", ""):
                return None
            kind = "bool"
        if kind == "bool":
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off"):
                return False
            raise ValueError("expected true or false")
        if kind == "int":
            if isinstance(value, bool):
                raise ValueError("expected an integer")
            if isinstance(value, int):
                out = value
            elif key.endswith("_bytes") or key.endswith("_bytes_per_s"):
                m = _SIZE_RE.match(str(value))
                if not m:
                    raise ValueError("expected a size such as 1048576, 64MiB or 1GiB")
                out = int(float(m.group(1)) * _SIZE_MULT[(m.group(2) or "").upper()])
            else:
                out = int(str(value).strip().replace("_", ""))
            if out < 0:
                raise ValueError("must not be negative")
            return out
        if kind == "float":
            if isinstance(value, bool):
                raise ValueError("expected a number")
            out = float(value)
            if out < 0:
                raise ValueError("must not be negative")
            return out
        if kind == "str":
            if not isinstance(value, (str, int)):
                raise ValueError("expected a string")
            return str(value)
        if kind.startswith("tuple"):
            if isinstance(value, str):
                items = [p.strip() for p in value.split(",") if p.strip()]
            elif isinstance(value, (list, tuple)):
                items = [str(p) for p in value]
            else:
                raise ValueError("expected a list of strings")
            if not items:
                raise ValueError("must name at least one entry")
            return tuple(items)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"bad value for {key!r}: {value!r} ({e})") from None
    raise ConfigError(f"setting {key!r} has an unsupported type {kind}")  # pragma: no cover


def http_loopback(address: str) -> bool:
    """True when the HTTP admin server's address (empty = 127.0.0.1) reaches this host only."""
    import ipaddress

    if address in ("", "localhost"):
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # a host name: it may resolve beyond loopback
        return False


def http_server_protected(cfg: "BookieConfig") -> bool:
    """The rule for the HTTP admin server: loopback, or a token, or mutual TLS."""
    return (http_loopback(cfg.http_server_address) or bool(cfg.http_server_token)
            or (cfg.http_server_tls_enable and cfg.tls_client_authentication))


def _check(cfg: BookieConfig) -> None:
    def bad(key: str, why: str) -> None:
        raise ConfigError(f"bad value for {key!r}: {getattr(cfg, key)!r} ({why})")

    if not 0 < cfg.bookie_port < 65536:
        bad("bookie_port", "must be 1..65535")
    if cfg.write_cache_max_size_bytes < 64 * KiB:  # two halves; an empty half takes any entry
        bad("write_cache_max_size_bytes", "must be at least 64KiB")
    if cfg.entry_log_size_limit_bytes < 64 * KiB:
        bad("entry_log_size_limit_bytes", "must be at least 64KiB")
    if cfg.entry_log_flush_bytes < 0:
        bad("entry_log_flush_bytes", "must be 0 (off) or a byte count")
    if cfg.journal_max_size_bytes < 64 * KiB:
        bad("journal_max_size_bytes", "must be at least 64KiB")
    if cfg.journal_format_version_to_write not in (1, 2):
        bad("journal_format_version_to_write", "must be 1 or 2")
    if not 1 <= cfg.journal_pre_alloc_size_mb <= 1024:
        bad("journal_pre_alloc_size_mb", "must be 1 to 1024")
    if not (512 <= cfg.journal_alignment_size <= MiB and cfg.journal_alignment_size & (cfg.journal_alignment_size - 1) == 0):
        bad("journal_alignment_size", "must be a power of two from 512 to 1048576")
    if cfg.max_frame_size_bytes < 1024:
        bad("max_frame_size_bytes", "must be at least 1024")
    if cfg.index_map_size_bytes < 1 * MiB:
        bad("index_map_size_bytes", "must be at least 1MiB")
    if not 0 < cfg.disk_usage_threshold <= 1:
        bad("disk_usage_threshold", "must be in (0, 1]")
    if cfg.num_read_worker_threads < 1:
        bad("num_read_worker_threads", "must be at least 1")
    if cfg.max_reads_in_progress_per_connection < 1:
        bad("max_reads_in_progress_per_connection", "must be at least 1")
    if cfg.read_io not in ("auto", "ring", "threads"):
        bad("read_io", "must be auto, ring or threads")
    if cfg.data_integrity_repair_parallel_ledgers < 1:
        bad("data_integrity_repair_parallel_ledgers", "must be at least 1")
    if cfg.http_server_port > 65535:
        bad("http_server_port", "must be 0 (ephemeral) or 1..65535")
    if not -1 <= cfg.autorecovery_metrics_port <= 65535:
        bad("autorecovery_metrics_port", "must be -1 (off), 0 (ephemeral) or 1..65535")
    if cfg.auditor_periodic_placement_policy_check_interval_s < 0:
        bad("auditor_periodic_placement_policy_check_interval_s", "must be 0 (off) or seconds")
    if cfg.http_server_enabled and cfg.http_server_port == cfg.bookie_port:
        bad("http_server_port", "the HTTP admin server and the bookie listen on the same address: "
                                "they need different ports")
    if cfg.http_server_tls_enable and not cfg.tls_certificate_path:
        bad("http_server_tls_enable", "HTTPS uses the bookie's TLS files: set tls_certificate_path and tls_key_store")
    if cfg.http_server_enabled and not http_server_protected(cfg):
        bad("http_server_address", f"the HTTP admin server would listen on {cfg.http_server_address} beyond "
                                   "loopback with no authentication: set http_server_token, or "
                                   "http_server_tls_enable with tls_client_authentication (mutual TLS), or leave "
                                   "http_server_address empty (127.0.0.1), or http_server_enabled = false")
    if cfg.prometheus_latency_shape not in ("summary", "histogram"):
        bad("prometheus_latency_shape", "must be summary (BookKeeper's) or histogram")
    if cfg.log_format not in ("text", "json"):
        bad("log_format", "must be text or json")
    if cfg.bookie_auth_provider not in ("", "token", "sasl"):
        bad("bookie_auth_provider", "must be empty (off), token or sasl")
    if cfg.bookie_auth_provider == "sasl" and not cfg.sasl_jaas_config_path:
        bad("sasl_jaas_config_path", "bookie_auth_provider = \"sasl\" needs the JAAS file of its users")
    if cfg.tls_provider.upper() not in ("OPENSSL", "PYTHON"):
        bad("tls_provider", "bk uses Python's ssl (OpenSSL)")
    for key in ("tls_key_store_type", "tls_trust_store_type"):
        if getattr(cfg, key).upper() != "PEM":
            bad(key, "bk reads PEM files only")
    if bool(cfg.tls_certificate_path) != bool(cfg.tls_key_store):
        bad("tls_certificate_path", "TLS needs both tls_certificate_path and tls_key_store")
    if cfg.zk_enable_security and not cfg.zk_digest_auth_path:
        bad("zk_enable_security", "needs zk_digest_auth_path (ZooKeeper digest credentials)")
    if cfg.tls_client_authentication and not cfg.tls_trust_store:
        bad("tls_client_authentication", "needs tls_trust_store (the CAs of client certificates)")
    try:
        parse_log_levels(cfg.log_level)
    except ValueError as e:
        bad("log_level", str(e))
    for key in ("minor_compaction_threshold", "major_compaction_threshold"):
        if getattr(cfg, key) > 1:
            bad(key, "must be in [0, 1]")
    if 0 < cfg.major_compaction_threshold < cfg.minor_compaction_threshold:
        bad("major_compaction_threshold", "must not be below minor_compaction_threshold")
    if cfg.shutdown_timeout_ms < 100:
        bad("shutdown_timeout_ms", "must be at least 100")
    if cfg.gc_wait_time_ms < 1:
        bad("gc_wait_time_ms", "must be at least 1")
    if cfg.gc_over_replicated_ledger_max_concurrent_requests < 1:
        bad("gc_over_replicated_ledger_max_concurrent_requests", "must be at least 1")
    if cfg.max_response_bytes_per_connection < 64 * KiB:
        bad("max_response_bytes_per_connection", "must be at least 64KiB")


def load_config(
    path: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | Iterable[str] | None = None,
    base: BookieConfig | None = None,
) -> BookieConfig:
    """Build a config. `overrides` is a mapping or `key=value` strings (from --set)."""
    values: dict[str, Any] = dataclasses.asdict(base) if base else {}
    if path:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
        for key, value in data.items():
            if key not in _FIELDS:
                raise ConfigError(f"unknown setting {key!r} in {path}")
            values[key] = _convert(key, value)
    for name, value in (os.environ if env is None else env).items():
        if name.startswith("BK_") and name[3:].lower() in _FIELDS:
            key = name[3:].lower()
            values[key] = _convert(key, value)
    if overrides:
        pairs = overrides.items() if isinstance(overrides, Mapping) else (_split_pair(s) for s in overrides)
        for key, value in pairs:
            if key not in _FIELDS:
                raise ConfigError(f"unknown setting {key!r}")
            values[key] = _convert(key, value)
    cfg = BookieConfig(**values)
    _check(cfg)
    return cfg


def _split_pair(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep:
        raise ConfigError(f"expected key=value, got {item!r}")
    return key.strip(), value.strip()


_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")


def parse_log_levels(text: str) -> tuple[str, dict[str, str]]:
    """`"INFO,bk.journal=DEBUG"` -> ("INFO", {"bk.journal": "DEBUG"}); ValueError names the bad part."""
    root, per_logger = "INFO", {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, level = part.rpartition("=")
        level = level.strip().upper()
        if level == "WARN":
            level = "WARNING"
        if level not in _LEVELS:
            raise ValueError(f"unknown level {level!r} (use {', '.join(_LEVELS)})")
        if sep:
            if not name.strip():
                raise ValueError(f"no logger name in {part!r}")
            per_logger[name.strip()] = level
        else:
            root = level
    return root, per_logger


def setting_names() -> list[str]:
    return list(_FIELDS)
