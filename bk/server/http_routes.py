"""The bookie's HTTP admin API: every path, its methods and its handler, in one list.

BookieServer hands ROUTES to bk.server.http_admin.HttpAdminServer, which serves exactly
these (the same handler for each method listed; HEAD wherever GET is). Adding an endpoint
is its handler (in http_handlers, http_ops or a module of its own) and one row here; the
paths and JSON shapes are BookKeeper's (docs/OPERATIONS.md lists them).
"""
from __future__ import annotations

from . import http_handlers as h
from . import http_ops as ops
from .http_admin import Route

ROUTES = (
    Route("/heartbeat", ("GET",), h.heartbeat),
    Route("/metrics", ("GET",), h.metrics_page),
    Route("/api/v1/bookie/info", ("GET",), h.bookie_info),
    Route("/api/v1/bookie/state", ("GET",), h.bookie_state),
    Route("/api/v1/bookie/state/readonly", ("GET", "PUT"), h.bookie_readonly),
    Route("/api/v1/bookie/is_ready", ("GET",), h.bookie_is_ready),
    Route("/api/v1/bookie/repair_status", ("GET",), h.repair_status),
    Route("/api/v1/bookie/last_log_mark", ("GET",), h.last_log_mark),
    Route("/api/v1/bookie/list_disk_file", ("GET",), h.list_disk_file),
    Route("/api/v1/bookie/gc", ("GET", "PUT"), h.gc),
    Route("/api/v1/bookie/gc_details", ("GET",), h.gc_details),
    Route("/api/v1/bookie/gc/compact", ("PUT",), h.gc_compact),
    Route("/api/v1/bookie/entry_log_usage", ("GET",), h.entry_log_usage),
    Route("/api/v1/bookie/list_bookies", ("GET",), h.list_bookies),
    Route("/api/v1/bookie/list_bookie_info", ("GET",), h.list_bookie_info),
    Route("/api/v1/bookie/cluster_info", ("GET",), h.cluster_info),
    Route("/api/v1/ledger/list", ("GET",), h.ledger_list),
    Route("/api/v1/ledger/metadata", ("GET",), h.ledger_metadata),
    Route("/api/v1/ledger/read", ("GET",), h.ledger_read),
    Route("/api/v1/ledger/delete", ("DELETE",), h.ledger_delete),
    Route("/api/v1/autorecovery/status", ("GET", "PUT"), h.autorecovery_status),
    Route("/api/v1/autorecovery/list_under_replicated_ledger", ("GET",), h.list_under_replicated),
    Route("/api/v1/autorecovery/who_is_auditor", ("GET",), h.who_is_auditor),
    Route("/api/v1/autorecovery/trigger_audit", ("PUT",), h.trigger_audit),
    Route("/api/v1/autorecovery/lost_bookie_recovery_delay", ("GET", "PUT"), h.lost_bookie_recovery_delay),
    Route("/api/v1/autorecovery/bookie", ("PUT",), h.recover_bookie),
    Route("/api/v1/autorecovery/decommission", ("PUT",), h.decommission),
    Route("/api/v1/config/server_config", ("GET", "PUT"), ops.server_config),
    Route("/api/v1/bookie/sanity", ("GET",), ops.bookie_sanity),
    Route("/api/v1/bookie/gc/suspend_compaction", ("GET", "PUT"), ops.suspend_compaction),
    Route("/api/v1/bookie/gc/resume_compaction", ("PUT",), ops.resume_compaction),
    Route("/api/v1/bookie/expand_storage", ("PUT",), ops.expand_storage),
)
