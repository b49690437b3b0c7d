"""The rest of BookKeeper's HTTP service for one bookie (docs/OPERATIONS.md): the server's
configuration (GET, and PUT of the settings that are safe to change at runtime), the sanity
check, suspending and resuming compaction, and storage expansion. Paths, methods, JSON bodies
and answers are BookKeeper's (its ConfigurationService, BookieSanityService,
SuspendCompactionService, ResumeCompactionService, ExpandStorageService).

Handlers are `async def h(admin, request)`, served at the paths bk.server.http_routes gives them.
PUT is a mutation: 403 unless http_server_mutations_enabled, and beyond loopback the
token (or mutual TLS) is required on every endpoint here (bk.server.http_admin).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging

from bk.errors import ConfigError

from .http_admin import HttpError, json_body, json_response

log = logging.getLogger(__name__)

# Settings PUT config/server_config may change: each is read from the bookie's one config
# object every time it is used (the GC thread per pass or wait, the disk checker per check,
# the entry logger per new log), so a new value takes effect without a restart. Everything
# else (dirs, ports, journal, caches, security) is fixed when the bookie starts: refused.
# Keys are bk's snake_case names; BookKeeper's camelCase names are taken too.
RUNTIME_SETTINGS = {
    "gc_wait_time_ms": "gcWaitTime",
    "minor_compaction_threshold": "minorCompactionThreshold",
    "minor_compaction_interval_s": "minorCompactionInterval",
    "major_compaction_threshold": "majorCompactionThreshold",
    "major_compaction_interval_s": "majorCompactionInterval",
    "is_force_gc_allow_when_no_space": "isForceGCAllowWhenNoSpace",
    "verify_metadata_on_gc": "verifyMetadataOnGC",
    "disk_usage_threshold": "diskUsageThreshold",
}
_BY_BOOKKEEPER_NAME = {bk_name: name for name, bk_name in RUNTIME_SETTINGS.items()}

SANITY_ENTRIES = 10  # BookKeeper's SanityTestCommand: 10 entries "entry-<i>" ...
SANITY_TIMEOUT_S = 10.0  # ... bk bounds the whole check (create, add, close, open, read, delete)


# ---------------------------------------------------------------- configuration
async def server_config(admin, request):
    """GET: every setting (snake_case; the token shown as "<set>"). PUT (a mutation), body
    {"name": value, ...}: BookKeeper's "Success set server config." when every name is in
    RUNTIME_SETTINGS and the new values pass the config's checks; else 400 naming what was
    refused, and nothing is changed."""
    if request.method == "GET":
        values = dataclasses.asdict(admin.config)
        if values.get("http_server_token"):
            values["http_server_token"] = "<set>"
        return json_response(values)
    body = await json_body(request)
    if not body:
        raise HttpError(400, 'give {"setting": value, ...} as the body')
    changes, refused = {}, []
    for key, value in body.items():
        name = _BY_BOOKKEEPER_NAME.get(key, key)
        if name in RUNTIME_SETTINGS:
            changes[name] = value
        else:
            refused.append(key)
    if refused:
        raise HttpError(400, f"not changeable at runtime: {', '.join(sorted(refused))} (change it in the"
                             f" config file and restart); changeable: {', '.join(sorted(RUNTIME_SETTINGS))}")
    try:
        checked = admin.config.replace(**changes)  # converts and validates as at start
    except (ConfigError, TypeError, ValueError) as e:
        raise HttpError(400, f"refused: {e}") from None
    live = getattr(admin.server, "config", admin.config)
    for name in changes:
        # The config is a frozen dataclass shared by the bookie's parts: these few fields are
        # replaced in place (under the GIL, one attribute at a time) so every reader sees them.
        object.__setattr__(live, name, getattr(checked, name))
        if admin.config is not live:
            object.__setattr__(admin.config, name, getattr(checked, name))
    log.info("settings changed over HTTP: %s", {n: getattr(checked, n) for n in changes})
    return json_response("Success set server config.")


# ---------------------------------------------------------------- sanity
async def sanity_check(config, bookie_id: str) -> None:
    """BookKeeper's bookie sanity test: a ledger of ensemble 1 on this bookie, SANITY_ENTRIES
    entries written, closed, opened again (its last entry must be the last written), read back
    and compared, then deleted. Raises on any failure."""
    from bk.client import BookKeeper
    from bk.client.placement import OneBookiePlacement

    bkc = await BookKeeper.for_bookie(config, placement=OneBookiePlacement(bookie_id)).start()
    ledger_id = None
    try:
        lh = await bkc.create_ledger(1, 1, 1, digest_type="MAC", password=b"")
        ledger_id = lh.ledger_id
        await asyncio.gather(*(lh.add_entry(b"entry-%d" % i) for i in range(SANITY_ENTRIES)))
        await lh.close()
        reader = await bkc.open_ledger(ledger_id, password=b"")
        if reader.last_add_confirmed != SANITY_ENTRIES - 1:
            raise RuntimeError(f"sanity ledger {ledger_id}: last entry {reader.last_add_confirmed},"
                               f" expected {SANITY_ENTRIES - 1}")
        for entry in await reader.read_entries(0, SANITY_ENTRIES - 1):
            if bytes(entry.data) != b"entry-%d" % entry.entry_id:
                raise RuntimeError(f"sanity ledger {ledger_id}: entry {entry.entry_id} read back differs")
    finally:
        try:
            if ledger_id is not None:
                await bkc.delete_ledger(ledger_id)
        finally:
            await bkc.close()


async def bookie_sanity(admin, request):
    """BookKeeper's {"passed": bool, "readOnly": bool}: a read-only bookie answers readOnly
    true (no test: it takes no adds); else a real write and read of a test ledger on this
    bookie (sanity_check), one at a time. GET as BookKeeper's, though it writes (its own
    ledger, deleted at the end): beyond loopback it needs the token as every endpoint does."""
    server = admin.server
    answer = {"passed": False, "readOnly": bool(server.bookie.read_only)}
    if answer["readOnly"]:
        return json_response(answer)
    lock = admin.__dict__.setdefault("_sanity_lock", asyncio.Lock())
    async with lock:
        try:
            async with asyncio.timeout(SANITY_TIMEOUT_S):
                await sanity_check(admin.config, server.bookie_id)
            answer["passed"] = True
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a failed check is the answer, as BookKeeper's
            log.warning("bookie sanity check failed: %s: %s", type(e).__name__, e)
    return json_response(answer)


# ---------------------------------------------------------------- compaction
def _collector(admin):
    collector = admin.server.bookie.gc
    if collector is None:
        raise HttpError(503, "garbage collection is not running on this bookie")
    return collector


def _flags(body: dict, major: str, minor: str) -> tuple[bool, bool]:
    values = []
    for key in (major, minor):
        value = body.get(key, False)
        if not isinstance(value, bool):
            raise HttpError(400, f"{key} must be true or false")
        values.append(value)
    return values[0], values[1]


def _said(verb: str, major: bool, minor: bool, bookie_id: str) -> str:
    """BookKeeper's answer: "<verb> majorGC on BookieServer: <id>, <verb> minorGC on ..."."""
    return ", ".join(f"{verb} {kind}GC on BookieServer: {bookie_id}"
                     for kind, asked in (("major", major), ("minor", minor)) if asked)


async def suspend_compaction(admin, request):
    """GET: {"isMajorGcSuspended": "true"|"false", "isMinorGcSuspended": ...} (strings, as
    BookKeeper's). PUT (a mutation), body {"suspendMajor": bool, "suspendMinor": bool}: the GC
    thread stops choosing that compaction (forced or due) until resumed; GC's deletions go on."""
    collector = _collector(admin)
    if request.method == "GET":
        return json_response({"isMajorGcSuspended": str(collector.suspend_major).lower(),
                              "isMinorGcSuspended": str(collector.suspend_minor).lower()})
    major, minor = _flags(await json_body(request), "suspendMajor", "suspendMinor")
    if not major and not minor:
        raise HttpError(400, "No suspendMajor or suspendMinor params found")
    collector.suspend_compaction(major=major, minor=minor)
    return json_response(_said("Suspend", major, minor, admin.server.bookie_id))


async def resume_compaction(admin, request):
    """PUT (a mutation), body {"resumeMajor": bool, "resumeMinor": bool}: undoes a suspension."""
    collector = _collector(admin)
    body = await json_body(request)
    if "resumeMajor" not in body and "resumeMinor" not in body:
        raise HttpError(400, "No resumeMajor or resumeMinor params found")
    major, minor = _flags(body, "resumeMajor", "resumeMinor")
    collector.resume_compaction(major=major, minor=minor)
    return json_response(_said("Resume", major, minor, admin.server.bookie_id))


# ---------------------------------------------------------------- storage expansion
def _reread_config(source):
    from bk.config import load_config

    path, overrides = source
    return load_config(path, overrides=overrides)


def _prepare_new_dirs(dirs) -> list[str]:
    """Create the added ledger dirs; the ones holding data under current/ are returned (refused)."""
    import os

    from bk.meta.cookie import directory_is_empty

    busy = []
    for d in dirs:
        os.makedirs(d, exist_ok=True)
        if not directory_is_empty(d):
            busy.append(d)
    return busy


async def expand_storage(admin, request):
    """BookKeeper's storage expansion (a mutation): the operator adds new, empty ledger dirs to
    the bookie's config file, then PUTs here. The file (with the bookie's --set overrides) is
    read again; when its ledger_dirs are this bookie's plus new ones, and its journal and index
    dirs unchanged, the cookie naming the new dirs is written to the metadata store (a CAS on
    its version) and into every dir: BookKeeper's "Success expand storage". bk cannot start
    writing to a dir at runtime: the bookie goes on with its old dirs and uses the new ones
    from its next restart (with the new file), which the new cookie then accepts."""
    from bk.meta.cookie import CookieStore, cookie_directories, stamp_cookies

    source = getattr(admin.server, "config_source", None)
    if not source or not source[0]:
        raise HttpError(409, "this bookie was not started from a config file (bk bookie --conf): add the"
                             " ledger dirs to a config file and restart with it")
    try:
        new = await admin.run_blocking(_reread_config, source)
    except ConfigError as e:
        raise HttpError(400, f"the config file cannot be used: {e}") from None
    cfg = admin.config
    if list(new.journal_dirs) != list(cfg.journal_dirs) or new.index_dir != cfg.index_dir:
        raise HttpError(400, "only ledger dirs can be added: the config file changes journal_dirs or index_dir")
    missing = [d for d in cfg.ledger_dirs if d not in new.ledger_dirs]
    if missing:
        raise HttpError(400, f"the config file drops ledger dirs this bookie uses: {', '.join(missing)}")
    added = [d for d in new.ledger_dirs if d not in cfg.ledger_dirs]
    cookies = CookieStore(admin.server.store)
    cookie, version = await cookies.read(admin.server.bookie_id)
    if list(cookie.ledger_dirs) == list(new.ledger_dirs):
        return json_response("Success expand storage")  # already expanded (asked twice)
    if list(cookie.ledger_dirs) != list(cfg.ledger_dirs):
        raise HttpError(409, f"the cookie of {admin.server.bookie_id} names ledger dirs"
                             f" {list(cookie.ledger_dirs)}, not this bookie's {list(cfg.ledger_dirs)}")
    busy = await admin.run_blocking(_prepare_new_dirs, added)
    if busy:
        raise HttpError(400, f"new ledger dirs must be empty: {', '.join(busy)} hold data")
    expanded = dataclasses.replace(cookie, ledger_dirs=tuple(new.ledger_dirs))
    await stamp_cookies(admin.server.store, expanded, cookie_directories(expanded), version)
    log.info("storage expanded with ledger dirs %s: used from the next restart with %s", added, source[0])
    return json_response("Success expand storage")
