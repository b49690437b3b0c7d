"""The HTTP admin API's endpoints (BookKeeper's paths and JSON shapes; docs/OPERATIONS.md).

Each handler is `async def h(admin, request)` with `admin` the HttpAdminServer
(`admin.server` the BookieServer). Each is served at the path bk.server.http_routes
gives it.
"""
from __future__ import annotations

import asyncio
import base64
import logging
import os

from aiohttp import web

from bk import metrics
from bk.errors import NoSuchLedgerMetadataError
from bk.fileio import total_space
from bk.meta.ledger_metadata import metadata_dict
from bk.formats.wire import BOOKIE_INFO_FREE_DISK_SPACE, BOOKIE_INFO_TOTAL_DISK_CAPACITY

from .admin import gc_calls
from .http_admin import (PAGE_SIZE, HttpError, JsonStream, json_body, json_response, page_slice, param_bool,
                         param_int, param_page, stream_json)

log = logging.getLogger(__name__)

FREE_AND_TOTAL = BOOKIE_INFO_FREE_DISK_SPACE | BOOKIE_INFO_TOTAL_DISK_CAPACITY  # GetBookieInfo's requested bits
BOOKIE_INFO_TIMEOUT_S = 5.0
READ_MAX_ENTRIES = 1000  # /api/v1/ledger/read answers at most this many entries


# ---------------------------------------------------------------- heartbeat, metrics (config: bk.server.http_ops)
async def heartbeat(admin, request):
    return web.Response(text="OK\n")


async def metrics_page(admin, request):
    body, content_type = metrics.exposition()
    resp = web.Response(body=body)
    resp.headers["Content-Type"] = content_type
    return resp


# ---------------------------------------------------------------- this bookie
async def bookie_info(admin, request):
    # the same figures as GetBookieInfo's (bk.fileio.total_space), off the loop
    space = await admin.run_blocking(total_space, admin.config.ledger_dirs)
    return json_response({"freeSpace": space.free_bytes, "totalSpace": space.total_bytes})


def _state(server) -> dict:
    bookie = server.bookie
    read_only = bool(bookie.read_only)
    return {"running": server.started and not server.shutting_down, "readOnly": read_only,
            "shuttingDown": server.shutting_down,
            "availableForHighPriorityWrites": server.started and not server.shutting_down,
            # bk: why it is read-only, and the disk faults behind it (docs/DISK-FAULTS.md)
            "readOnlyReason": bookie.read_only_reason, "storageFailure": bookie.storage_failure,
            "diskFull": bookie.disk_full}


async def bookie_state(admin, request):
    return json_response(_state(admin.server))


async def bookie_readonly(admin, request):
    server = admin.server
    if request.method == "PUT":
        body = await json_body(request)
        wanted = body.get("readOnly", request.query.get("readOnly"))
        if isinstance(wanted, str) and wanted.lower() in ("true", "false"):
            wanted = wanted.lower() == "true"
        if not isinstance(wanted, bool):
            raise HttpError(400, 'give {"readOnly": true|false} as the body')
        if not server.started or server.shutting_down:
            raise HttpError(503, "the bookie is not running")
        await server.set_read_only(wanted)
    return json_response({"readOnly": bool(server.bookie.read_only)})


async def bookie_is_ready(admin, request):
    server = admin.server
    if server.started and not server.shutting_down:
        return web.Response(text="OK\n")
    return web.Response(status=503, text="Bookie is not ready\n")


async def repair_status(admin, request):
    """BP-46 (docs/JOURNAL-OFF.md): whether this bookie may have lost data and its self-repair's
    progress; bk's own endpoint (BookKeeper has none). `repair` is null when none ran since start."""
    server = admin.server
    repair = server.repair
    return json_response({
        "dataIntegrityChecking": server.config.data_integrity_checking,
        "needsIntegrityCheck": await asyncio.to_thread(lambda: server.bookie.needs_integrity_check),
        "limboLedgers": len(server.bookie.limbo_ledgers()),
        "phaseOne": server.phase_one.as_dict() if server.phase_one is not None else None,
        "repair": repair.status.as_dict() if repair is not None else None})


async def last_log_mark(admin, request):
    """BookKeeper's GetLastLogMarkService answer: per journal, its current log mark (what a
    checkpoint would persist now) as {"LastLogMark: Journal Id - <id>(<id in hex>.txn)":
    "Pos - <offset>"}."""
    out = {}
    for journal in admin.server.bookie.journals:
        mark = journal.last_mark()
        out[f"LastLogMark: Journal Id - {mark.file_id}({mark.file_id:x}.txn)"] = f"Pos - {mark.offset}"
    return json_response(out)


def _list_disk_files(config, kinds) -> dict:
    from bk.formats.entrylog import log_dir, parse_log_file_name
    from bk.journal.records import list_files

    out = {}
    if "journal" in kinds:
        out["journal files"] = " ".join(path for d in config.journal_dirs for _, path in list_files(d))
    if "entrylog" in kinds:
        names = []
        for d in config.ledger_dirs:
            try:
                names += sorted(os.path.join(log_dir(d), n) for n in os.listdir(log_dir(d))
                                if parse_log_file_name(n) is not None)
            except FileNotFoundError:
                pass
        out["entrylog files"] = " ".join(names)
    if "index" in kinds:
        d = config.resolved_index_dir
        try:
            out["index files"] = " ".join(sorted(os.path.join(d, n) for n in os.listdir(d)))
        except FileNotFoundError:
            out["index files"] = ""
    return out


async def list_disk_file(admin, request):
    kind = request.query.get("file_type", "")
    kinds = ("journal", "entrylog", "index")
    if kind and kind not in kinds:
        raise HttpError(400, f"file_type must be one of {', '.join(kinds)}, got {kind!r}")
    return json_response(await admin.run_blocking(_list_disk_files, admin.config, (kind,) if kind else kinds))


# ---------------------------------------------------------------- GC (docs/GC.md)
async def gc(admin, request):
    """GET: BookKeeper's {"is_in_force_gc": "true"|"false"} ("true" from the PUT until its pass
    ends). PUT (a mutation), body {"forceMajor": bool, "forceMinor": bool}: asks for a pass and
    answers at once, as BookKeeper's does, with its JSON string "Triggered GC on BookieServer: id";
    the pass runs on the GC's own executor (bk.server.admin.GcCalls), its figures land in gc_details."""
    collector = admin.server.bookie.gc
    if collector is None:
        raise HttpError(503, "garbage collection is not running on this bookie")
    calls = gc_calls(collector)
    if request.method == "GET":
        return json_response({"is_in_force_gc": str(calls.in_force()).lower()})
    body = await json_body(request)
    flags = {}
    for key, name in (("forceMajor", "force_major"), ("forceMinor", "force_minor")):
        value = body.get(key, False)
        if not isinstance(value, bool):
            raise HttpError(400, f"{key} must be true or false")
        flags[name] = value
    calls.trigger_in_background(**flags)
    return json_response(f"Triggered GC on BookieServer: {admin.server.bookie_id}")


async def gc_details(admin, request):
    """The collector's status (last pass, its figures, compactions, settings) as a one-item list,
    BookKeeper's shape for one ledger storage."""
    collector = admin.server.bookie.gc
    if collector is None:
        raise HttpError(503, "garbage collection is not running on this bookie")
    return json_response([collector.status()])


async def gc_compact(admin, request):
    """A compaction plan (bk analytics gc -> bk shell compact --plan): body {"logIds": [int, ...]};
    compacts exactly those logs through the GC's safe path and answers the pass's figures
    with "plan": {log id: outcome} (bk.bookie.gc.GarbageCollector.compact_logs)."""
    collector = admin.server.bookie.gc
    if collector is None:
        raise HttpError(503, "garbage collection is not running on this bookie")
    ids = (await json_body(request)).get("logIds")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise HttpError(400, 'give {"logIds": [non-negative integers]} as the body')
    return json_response(await gc_calls(collector).call(collector.compact_logs, ids))


def _entry_logs(config) -> list[tuple[str, str]]:
    """(ledger dir, path) of every entry log, by dir then log id."""
    from bk.entrylog.usage import list_entry_logs
    return [(d, path) for d in config.ledger_dirs for _log_id, path in list_entry_logs(d)]


def _usage_rows(paths: list[str]) -> list[dict]:
    from bk.entrylog.usage import log_usage_row
    return [log_usage_row(p) for p in paths]


async def entry_log_usage(admin, request):
    """Every entry log's usage read from the files (ledgers map, or a walk of the records
    when the log has none), bk's own endpoint for analytics on a Spark cluster that cannot
    read this bookie's disks (spark/sources.py bk_remote_entry_logs; docs/ANALYTICS.md):
    {"bookie_id", "ledger_dirs": {dir: [usage row, ...]}}. Read-only; files only, no lock.
    `page` N (from 1) answers the Nth PAGE_SIZE logs (by dir, then log id); every dir is a
    key even when the page has none of its logs. Files are read on the admin's own thread
    PAGE_SIZE logs at a time and each batch is streamed as it is read."""
    page = param_page(request)
    logs = page_slice(await admin.run_blocking(_entry_logs, admin.config), page)
    out = JsonStream(request)
    try:
        await out.open("{")
        await out.members({"bookie_id": admin.server.bookie_id})
        await out.key("ledger_dirs")
        await out.open("{")
        for d in admin.config.ledger_dirs:
            paths = [p for dd, p in logs if dd == d]
            await out.key(d)
            await out.open("[")
            for start in range(0, len(paths), PAGE_SIZE):
                await out.items(await admin.run_blocking(_usage_rows, paths[start:start + PAGE_SIZE]))
            await out.close("]")
        await out.close("}")
        await out.close("}")
        return await out.finish()
    except Exception:
        if not out.response.prepared:
            raise
        log.exception("GET %s failed after part of the answer was sent: connection cut", request.path_qs)
        out.abort()
        return out.response


# ---------------------------------------------------------------- the cluster
async def list_bookies(admin, request):
    kind = request.query.get("type", "")
    if kind not in ("rw", "ro"):
        raise HttpError(400, "parameter type must be rw (writable bookies) or ro (read-only bookies)")
    hostnames = param_bool(request, "print_hostnames")
    reg = admin.server.registration
    bookies = await (reg.writable_bookies() if kind == "rw" else reg.readonly_bookies())
    return json_response({b: (b.rpartition(":")[0] if hostnames else None) for b in sorted(bookies)})


async def _bookie_space(pool, bookie_id: str) -> dict | None:
    client = pool.get(bookie_id)
    try:
        async with asyncio.timeout(BOOKIE_INFO_TIMEOUT_S):
            resp = await client.call(client.send_bookie_info, FREE_AND_TOTAL)
    except Exception:  # noqa: BLE001 - an unreachable bookie is reported as null
        return None
    return {"free": resp.free_disk_bytes, "total": resp.total_disk_bytes}


async def list_bookie_info(admin, request):
    bkc = await admin.client()
    reg = admin.server.registration
    bookies = sorted({*await reg.writable_bookies(), *await reg.readonly_bookies()})
    answers = await asyncio.gather(*(_bookie_space(bkc.pool, b) for b in bookies))
    out = {b: a for b, a in zip(bookies, answers)}
    known = [a for a in answers if a is not None]
    out["clusterInfo"] = {"total_free": sum(a["free"] for a in known), "total": sum(a["total"] for a in known)}
    return json_response(out)


async def cluster_info(admin, request):
    from bk.meta.underreplication import LedgerUnderreplicationManager
    from bk.replication.election import current_auditor

    store = admin.server.store
    reg = admin.server.registration
    writable, readonly = set(await reg.writable_bookies()), set(await reg.readonly_bookies())
    known = set(await reg.known_bookies())
    urm = LedgerUnderreplicationManager(store)
    try:
        auditor = await current_auditor(store)
        enabled = await urm.is_ledger_replication_enabled()
        underreplicated = False
        async for _ in urm.iter_underreplicated_ledgers():
            underreplicated = True
            break
    finally:
        await urm.close()
    return json_response({
        "auditorElected": auditor is not None, "auditorId": auditor or "",
        "clusterUnderReplicated": underreplicated, "ledgerReplicationEnabled": enabled,
        "totalBookiesCount": len(known | writable | readonly), "writableBookiesCount": len(writable),
        "readonlyBookiesCount": len(readonly),
        "unavailableBookiesCount": len(known - writable - readonly)})


# ---------------------------------------------------------------- ledgers
def _ledger_id(request) -> int:
    return param_int(request, "ledger_id", lowest=0)


async def ledger_list(admin, request):
    """BookKeeper's {"ledgerId": metadata or null}, by ledger id. `page` N (from 1) answers the
    Nth PAGE_SIZE ledgers (BookKeeper pages only with print_metadata; bk pages both), no
    `page` all of them. Metadata is read PAGE_SIZE ledgers at a time, concurrently (as
    BookKeeper's batches), and each batch is streamed as it comes (JsonStream)."""
    from bk.meta.ledger_manager import LedgerManager

    with_metadata = param_bool(request, "print_metadata")
    page = param_page(request)
    lm = LedgerManager(admin.server.store)
    ids = page_slice(sorted(await lm.list_ledger_ids()), page)
    out = JsonStream(request)
    try:
        await out.open("{")
        for start in range(0, len(ids), PAGE_SIZE):
            batch = ids[start:start + PAGE_SIZE]
            if not with_metadata:
                await out.members(dict.fromkeys(map(str, batch)))
                continue
            found = await asyncio.gather(*(lm.read_ledger_metadata(i) for i in batch), return_exceptions=True)
            members = {}
            for ledger_id, got in zip(batch, found):
                if isinstance(got, NoSuchLedgerMetadataError):
                    continue  # deleted meanwhile
                if isinstance(got, BaseException):
                    raise got
                members[str(ledger_id)] = metadata_dict(ledger_id, *got)
            await out.members(members)
        await out.close("}")
        return await out.finish()
    except Exception:
        if not out.response.prepared:
            raise  # nothing sent yet: the guard answers a JSON error
        log.exception("GET %s failed after part of the answer was sent: connection cut", request.path_qs)
        out.abort()
        return out.response


async def ledger_metadata(admin, request):
    from bk.meta.ledger_manager import LedgerManager

    ledger_id = _ledger_id(request)
    md, version = await LedgerManager(admin.server.store).read_ledger_metadata(ledger_id)
    return json_response({str(ledger_id): metadata_dict(ledger_id, md, version)})


async def ledger_read(admin, request):
    """Entries start_entry_id..end_entry_id (default: all up to the last confirmed, at most
    READ_MAX_ENTRIES) as text, or base64 with encoding=base64. Never fences: an open ledger
    is read up to its last add confirmed."""
    ledger_id = _ledger_id(request)
    first = param_int(request, "start_entry_id", 0, lowest=0)
    encoding = request.query.get("encoding", "text")
    if encoding not in ("text", "base64"):
        raise HttpError(400, "encoding must be text or base64")
    bkc = await admin.client()
    md = await bkc.get_ledger_metadata(ledger_id)
    handle = await bkc.open_ledger(ledger_id, password=md.password or b"", recovery=False)
    last = param_int(request, "end_entry_id", handle.last_add_confirmed, lowest=-1)
    if last < first:
        if "end_entry_id" in request.query:
            raise HttpError(400, f"end_entry_id {last} is before start_entry_id {first}")
        return json_response({})
    if last - first + 1 > READ_MAX_ENTRIES:
        raise HttpError(400, f"at most {READ_MAX_ENTRIES} entries at once: narrow start_entry_id..end_entry_id")
    if last > handle.last_add_confirmed:
        raise HttpError(404, f"ledger {ledger_id} has no confirmed entry past {handle.last_add_confirmed}")
    entries = await handle.read_entries(first, last)
    render = (lambda b: base64.b64encode(b).decode()) if encoding == "base64" else \
        (lambda b: b.decode("utf-8", errors="backslashreplace"))
    return json_response({str(e.entry_id): render(bytes(e.data)) for e in entries})


async def ledger_delete(admin, request):
    ledger_id = _ledger_id(request)
    bkc = await admin.client()
    await bkc.delete_ledger(ledger_id)
    return json_response({"deleted": ledger_id})


# ---------------------------------------------------------------- AutoRecovery
async def _with_urm(admin, fn):
    from bk.meta.underreplication import LedgerUnderreplicationManager

    urm = LedgerUnderreplicationManager(admin.server.store)
    try:
        return await fn(urm)
    finally:
        await urm.close()


async def autorecovery_status(admin, request):
    async def go(urm):
        if request.method == "PUT":
            if "enabled" not in request.query:
                raise HttpError(400, "missing parameter enabled (true or false)")
            if param_bool(request, "enabled"):
                await urm.enable_ledger_replication()
            else:
                await urm.disable_ledger_replication()
        return json_response({"enabled": await urm.is_ledger_replication_enabled()})
    return await _with_urm(admin, go)


async def list_under_replicated(admin, request):
    from bk.replication.admin import list_underreplicated

    missing = request.query.get("missingreplica") or None
    excluding = request.query.get("excludingmissingreplica") or None
    with_replicas = param_bool(request, "printmissingreplica")

    async def go(urm):
        rows = await list_underreplicated(urm, missing_replica=missing)
        if excluding:
            rows = [r for r in rows if excluding not in r.missing_replicas]
        if with_replicas:  # one entry per under-replicated ledger: streamed, there may be many
            return await stream_json(request, {str(r.ledger_id): list(r.missing_replicas) for r in rows})
        return await stream_json(request, [r.ledger_id for r in rows])
    return await _with_urm(admin, go)


async def who_is_auditor(admin, request):
    from bk.replication.election import current_auditor

    auditor = await current_auditor(admin.server.store)
    if auditor is None:
        raise HttpError(404, "no auditor is elected (is AutoRecovery enabled on some bookie?)")
    return json_response({"Auditor": auditor})


async def trigger_audit(admin, request):
    from bk.replication.admin import trigger_audit as trigger

    await _with_urm(admin, trigger)
    return json_response({"triggered": True})


async def lost_bookie_recovery_delay(admin, request):
    async def go(urm):
        if request.method == "PUT":
            body = await json_body(request)
            delay = body.get("delay_seconds")
            if not isinstance(delay, int) or isinstance(delay, bool) or delay < 0:
                raise HttpError(400, 'give {"delay_seconds": N} with N >= 0 as the body')
            await urm.set_lost_bookie_recovery_delay(delay)
        return json_response({"lostBookieRecoveryDelay": await urm.get_lost_bookie_recovery_delay(0)})
    return await _with_urm(admin, go)


def _bookie_list(value, name: str, required: bool) -> list[str]:
    from bk.meta.cluster import check_bookie_id
    from bk.meta.registration import split_bookie_id

    if value is None and not required:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise HttpError(400, f"{name} must be a bookie id (host:port) or a list of them")
    for v in value:
        try:
            split_bookie_id(check_bookie_id(v))
        except Exception as e:  # noqa: BLE001
            raise HttpError(400, f"{name}: {e}") from None
    return value


async def recover_bookie(admin, request):
    """Recover the ledgers of lost bookies (BookKeeper's manual recovery), in the background:
    the answer says it started; the bookie's log says how it ended."""
    from bk.replication import BookieRecovery

    body = await json_body(request)
    sources = _bookie_list(body.get("bookie_src"), "bookie_src", True)
    targets = _bookie_list(body.get("bookie_dest"), "bookie_dest", False)
    delete_cookie = bool(body.get("delete_cookie", False))
    cfg = admin.config
    bkc = await admin.client()

    async def run():
        recovery = BookieRecovery(bkc, window_entries=cfg.rereplication_entry_batch_size,
                                  rate_bytes_per_s=cfg.replication_rate_bytes_per_s)
        done = {}
        for src in sources:
            summary = await recovery.recover(src, target=targets[0] if targets else None,
                                             delete_cookie=delete_cookie)
            done[src] = {"ok": summary.ok, "recovered": summary.by_status("recovered"),
                         "failed": [r.ledger_id for r in summary.failed]}
        return done
    if not admin.spawn("recover:" + ",".join(sources), run()):
        raise HttpError(409, f"a recovery of {', '.join(sources)} is already running")
    return json_response({"started": True, "bookie_src": sources, "bookie_dest": targets,
                          "delete_cookie": delete_cookie})


async def decommission(admin, request):
    """Decommission a stopped bookie through AutoRecovery, in the background."""
    from bk.meta.underreplication import LedgerUnderreplicationManager
    from bk.replication.admin import decommission_bookie

    body = await json_body(request)
    src = _bookie_list(body.get("bookie_src"), "bookie_src", True)
    if len(src) != 1:
        raise HttpError(400, "bookie_src must name one bookie")
    bookie_id = src[0]
    if await admin.server.registration.registration(bookie_id) is not None:
        raise HttpError(400, f"bookie {bookie_id} is registered (running): stop it before decommissioning")
    bkc = await admin.client()

    async def run():
        urm = LedgerUnderreplicationManager(bkc.store)
        try:
            return await decommission_bookie(bkc, urm, bookie_id)
        finally:
            await urm.close()
    if not admin.spawn("decommission:" + bookie_id, run()):
        raise HttpError(409, f"a decommission of {bookie_id} is already running")
    return json_response({"started": True, "bookie_src": bookie_id})
