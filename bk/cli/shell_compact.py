"""`bk shell compact --plan OUT/summary.json`: hand each bookie its compaction plan.

The plan comes from `bk analytics gc` (spark/gc_job.py): summary.json's "plan" lists
(bookie_id, log_id) pairs. Each bookie gets its own list and compacts exactly those
logs through its GC's safe compaction path (GarbageCollector.compact_logs: the pass's
scan-and-compare runs first, so a ledger is only dropped once the metadata store says
it is gone; crash safety is the compactor's, docs/GC.md). The command reports, per
bookie, what each log became and the bytes freed and rewritten.

How a bookie is reached, per bookie: `--socket BOOKIE_ID=PATH` (its admin socket, on
this machine), `--url BOOKIE_ID=URL` (its HTTP admin server), else the HTTP endpoint it
registered in the metadata store (needs http_server_mutations_enabled on the bookie;
--token for http_server_token). Bookies run their plans at the same time.
"""
from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

from bk.errors import BKError, ConfigError

from .commands import arg, command_table
from .progress import progress_bar

COMMANDS, command = command_table()
COMPACT_PATH = "/api/v1/bookie/gc/compact"


def load_plan(path: str) -> tuple[float, dict[str, list[int]]]:
    """(threshold, bookie id -> sorted log ids) of a summary.json; ConfigError when it is not one."""
    try:
        with open(path) as fh:
            doc = json.load(fh)
        if doc.get("error"):  # a run with a gap (unreadable logs) planned from partial figures
            raise ConfigError(f"{path} is the summary of a failed run, its plan is not used: {doc['error']}")
        plan = doc["plan"]
        by_bookie: dict[str, list[int]] = {}
        for item in plan["logs"]:
            log_id = item["log_id"]
            if not isinstance(log_id, int) or isinstance(log_id, bool) or log_id < 0:
                raise ValueError(f"bad log id {log_id!r}")
            by_bookie.setdefault(str(item["bookie_id"]), []).append(log_id)
        return float(plan["threshold"]), {b: sorted(set(ids)) for b, ids in sorted(by_bookie.items())}
    except OSError as e:
        raise ConfigError(f"cannot read the plan {path}: {e.strerror or e}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path} is not a bk analytics gc summary with a plan: {e}") from None


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.rpartition("=")
        if not sep or not key or not value:
            raise ConfigError(f"--{what} takes BOOKIE_ID={what.upper()}, got {item!r}")
        out[key] = value
    return out


def _via_http(url: str, log_ids: list[int], token: str, timeout_s: float) -> dict:
    req = urllib.request.Request(url.rstrip("/") + COMPACT_PATH, method="PUT",
                                 data=json.dumps({"logIds": log_ids}).encode(),
                                 headers={"Content-Type": "application/json"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        try:
            why = json.loads(e.read()).get("error", e.reason)
        except ValueError:
            why = e.reason
        raise BKError(f"{url}: HTTP {e.code}: {why}") from None
    except OSError as e:
        raise BKError(f"{url}: {getattr(e, 'reason', None) or e}") from None


def _via_socket(path: str, log_ids: list[int], timeout_s: float) -> dict:
    from bk.server.admin import AdminError, admin_call
    try:
        return admin_call(path, "gc_compact_logs", timeout_s=timeout_s, log_ids=log_ids)
    except AdminError as e:
        raise BKError(str(e)) from None


async def _routes(args, bookies: list[str]) -> dict[str, tuple[str, str]]:
    sockets, urls = _pairs(args.socket, "socket"), _pairs(args.url, "url")
    routes = {b: ("socket", sockets[b]) for b in bookies if b in sockets}
    routes.update({b: ("http", urls[b]) for b in bookies if b in urls and b not in routes})
    rest = [b for b in bookies if b not in routes]
    if rest:
        from bk.meta import open_store
        from bk.meta.registration import RegistrationManager

        from .shell import metadata_uri
        store = await open_store(metadata_uri(args))
        try:
            reg = RegistrationManager(store)
            for b in rest:
                info = await reg.get_service_info(b)
                url = info.http_url() if info is not None else None
                if url is None:
                    raise ConfigError(f"bookie {b} is not registered with an HTTP endpoint: give --url {b}=URL"
                                      f" or --socket {b}=PATH")
                routes[b] = ("http", url)
        finally:
            await store.close()
    return routes


# local: the metadata store is asked (in _routes) only for bookies without --socket/--url
@command("compact", local=True, help="compact the entry logs a `bk analytics gc` plan lists, on each bookie",
         args=(arg("--plan", required=True, metavar="SUMMARY_JSON", help="summary.json of bk analytics gc"),
               arg("--bookie", action="append", metavar="BOOKIE_ID", help="only this bookie (repeatable)"),
               arg("--socket", action="append", default=[], metavar="BOOKIE_ID=PATH",
                   help="reach it by admin socket"),
               arg("--url", action="append", default=[], metavar="BOOKIE_ID=URL", help="reach it at this HTTP URL"),
               arg("--token", default="", help="the bookies' http_server_token"),
               arg("--timeout", type=float, default=3600.0, help="seconds to wait per bookie (default 3600)"),
               arg("--dry-run", action="store_true", help="print what each bookie would be asked, send nothing")))
async def cmd_compact(uri, args):
    threshold, plan = load_plan(args.plan)
    if args.bookie:
        plan = {b: ids for b, ids in plan.items() if b in set(args.bookie)}
    if not plan:
        return {"ok": True, "threshold": threshold, "bookies": {}, "text": f"the plan at {threshold:.2f} lists no log"}
    routes = await _routes(args, sorted(plan))
    if args.dry_run:
        lines = [f"{b}: {len(ids)} logs via {routes[b][0]} {routes[b][1]}: {', '.join(f'{i:x}' for i in ids)}"
                 for b, ids in plan.items()]
        return {"ok": True, "dry_run": True, "threshold": threshold,
                "bookies": {b: {"log_ids": ids, "via": routes[b]} for b, ids in plan.items()}, "text": "\n".join(lines)}

    def one(bookie: str) -> dict:
        kind, where = routes[bookie]
        try:
            r = (_via_socket(where, plan[bookie], args.timeout) if kind == "socket"
                 else _via_http(where, plan[bookie], args.token, args.timeout))
        except BKError as e:
            return {"ok": False, "error": str(e), "log_ids": plan[bookie]}
        outcome = {str(k): v for k, v in (r.get("plan") or {}).items()}
        return {"ok": bool(r.get("ok")), "log_ids": plan[bookie], "outcome": outcome,
                "bytes_freed": r.get("bytes_freed", 0), "bytes_rewritten": r.get("bytes_rewritten", 0),
                "ledgers_deleted": len(r.get("ledgers_deleted") or ()), "errors": r.get("errors") or []}
    by_bookie: dict = {}
    total = sum(len(ids) for ids in plan.values())

    async def named(bookie: str):
        return bookie, await asyncio.to_thread(one, bookie)
    with progress_bar(total=total, desc="compaction", unit="log", quiet=args.json) as bar:
        # bookies compact at once; the bar (and, without a terminal, a line) moves as each ends
        for fut in asyncio.as_completed([named(b) for b in plan]):
            bookie, r = await fut
            by_bookie[bookie] = r
            logs = sum(len(plan[b]) for b in by_bookie)
            freed = sum(x.get("bytes_freed", 0) for x in by_bookie.values())
            bar.update_to(logs, postfix=f"{freed} bytes freed")
            bar.note(f"compaction: {bookie} {'done' if r['ok'] else 'FAILED'} ({len(by_bookie)}/{len(plan)} "
                     f"bookies, {logs}/{total} logs)")
    by_bookie = {b: by_bookie[b] for b in plan}
    lines = [f"compaction plan at threshold {threshold:.2f}: {sum(len(v) for v in plan.values())} logs on "
             f"{len(plan)} bookies"]
    for b, r in by_bookie.items():
        if "outcome" not in r:
            lines.append(f"  {b}: FAILED: {r['error']}")
            continue
        counts: dict[str, int] = {}
        for v in r["outcome"].values():
            counts[v] = counts.get(v, 0) + 1
        lines.append(f"  {b}: {', '.join(f'{n} {k}' for k, n in sorted(counts.items()))}; freed "
                     f"{r['bytes_freed']} bytes, rewrote {r['bytes_rewritten']} bytes"
                     + (f"; errors: {'; '.join(r['errors'])}" if r["errors"] else ""))
    freed = sum(r.get("bytes_freed", 0) for r in by_bookie.values())
    lines.append(f"  total freed {freed} bytes")
    return {"ok": all(r["ok"] for r in by_bookie.values()), "threshold": threshold, "bookies": by_bookie,
            "bytes_freed": freed, "text": "\n".join(lines)}
