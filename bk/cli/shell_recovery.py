"""`bk shell` commands for bookie recovery and AutoRecovery (declared with @command).

    recover BOOKIE_ID [--ledger ID] [--target BOOKIE_ID] [--query] [--dry-run]
            [--skip-open-ledgers] [--delete-cookie] [--rate BYTES_PER_S] [--yes]
    autorecovery --enable | --disable | --status
    lostbookierecoverydelay [--set SECONDS]
    whoisauditor
    listunderreplicated [--missing-replica BOOKIE_ID] [--print-missing-replicas] [--print-worker]
    triggeraudit
    decommissionbookie BOOKIE_ID [--timeout SECONDS]

`recover` changes nothing before it is confirmed: --yes, or "y" typed at the
prompt; without a terminal and without --yes it refuses. On a terminal it shows
a progress bar (ledgers done/total, bytes copied, rate) on stderr, otherwise one
line per ledger on stdout; the summary names every ledger that failed, and the
exit code is 1 if any did.
"""
from __future__ import annotations

import sys

from bk.errors import IncorrectParameterError

from .progress import progress_bar
from .commands import arg, command_table, one_of

COMMANDS, command = command_table()


def _settings(args) -> tuple[int, int]:
    """(entries in flight, rate) from --batch-size/--rate, else --conf, else the defaults."""
    from bk.config import load_config

    overrides = {}
    if getattr(args, "rate", None) is not None:
        overrides["replication_rate_bytes_per_s"] = args.rate
    if getattr(args, "batch_size", None) is not None:
        if args.batch_size < 1:
            raise IncorrectParameterError("--batch-size must be at least 1")
        overrides["rereplication_entry_batch_size"] = args.batch_size
    cfg = load_config(args.conf, overrides=overrides, env={})
    return cfg.rereplication_entry_batch_size, cfg.replication_rate_bytes_per_s


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.1f} MB"


class _Progress:
    """Recovery's display (bk.cli.progress): a bar of ledgers on a terminal, else one line per ledger."""

    def __init__(self, quiet: bool):
        self._bar = progress_bar(desc="recover", unit="ledger", quiet=quiet)
        self.tty = self._bar.tty

    def bar(self, progress) -> None:
        self._bar.update_to(progress.ledgers_done, progress.ledgers_total,
                            f"{_mb(progress.bytes_copied)} copied, {_mb(progress.rate_bytes_per_s)}/s")

    def ledger(self, progress, result) -> None:
        line = f"ledger {result.ledger_id}: {result.status}"
        if result.outcome is not None and result.outcome.segments:
            line += (f" ({len(result.outcome.segments)} segment(s), {result.outcome.entries} entries,"
                     f" {_mb(result.bytes)} to {', '.join(sorted({s.target for s in result.outcome.segments}))})")
        if result.outcome is not None and result.outcome.fenced:
            line += " [fenced and closed]"
        if result.error:
            line += f": {result.error}"
        self._bar.note(line if self.tty else f"[{progress.ledgers_done}/{progress.ledgers_total}] {line}")
        self.bar(progress)

    def done(self) -> None:
        self._bar.close()


def _plan_rows(plans) -> list[dict]:
    return [{"ledger_id": p.ledger_id, "state": p.state, "open_end": p.open_end, "entries": p.entries,
             "segments": [{"first_entry_id": s.first_entry_id, "last_entry_id": s.last_entry_id,
                           "entries": s.entries, "bookies": list(s.ensemble)} for s in p.segments]}
            for p in plans]


def _plan_text(plans, args) -> str:
    lines = []
    for p in plans:
        segs = ", ".join(f"{s.first_entry_id}..{s.last_entry_id if s.last_entry_id is not None else 'open'}"
                         for s in p.segments)
        action = ""
        if p.open_end:
            action = " - skipped (not closed)" if args.skip_open_ledgers else " - fence and close first"
        lines.append(f"ledger {p.ledger_id} ({p.state}): {p.entries} entries on {args.bookie_id} in segment(s)"
                     f" {segs}{action}")
    return "\n".join(lines)


@command("recover", help="re-replicate every ledger of a lost bookie (manual recovery)",
         args=(arg("bookie_id", help="the lost bookie, host:port"),
               arg("--ledger", type=int, default=None, help="only this ledger"),
               arg("--target", default=None,
                   help="copy to this bookie (default: a random writable bookie outside each segment)"),
               arg("--query", action="store_true", help="only list the ledgers that use the bookie"),
               arg("--dry-run", action="store_true", help="print what would be done and change nothing"),
               arg("--skip-open-ledgers", action="store_true",
                   help="never fence: leave alone ledgers that are not closed and whose last (still written)"
                        " segment uses the bookie"),
               arg("--delete-cookie", action="store_true",
                   help="delete the bookie's cookie once every ledger is recovered"),
               arg("--rate", default=None, metavar="BYTES_PER_S",
                   help="copy at most this many bytes per second (e.g. 50MiB; default: no limit)"),
               arg("--batch-size", type=int, default=None, help="entries in flight (default 100)"),
               arg("--yes", "-y", action="store_true", help="do not ask for confirmation")))
async def cmd_recover(uri, args):
    from bk.client import BookKeeper
    from bk.replication import BookieRecovery

    window, rate = _settings(args)
    async with BookKeeper(uri) as bkc:
        recovery = BookieRecovery(bkc, window_entries=window, rate_bytes_per_s=rate)
        plans = await recovery.affected_ledgers(args.bookie_id, args.ledger)
        rows = _plan_rows(plans)
        if args.query:
            text = "\n".join(f"{p.ledger_id}\t{p.state}" for p in plans) or f"no ledger uses {args.bookie_id}"
            return {"ok": True, "bookie_id": args.bookie_id, "ledgers": rows, "text": text}
        if args.dry_run:
            target = args.target or "a random writable bookie outside each segment"
            text = (f"dry run: {len(plans)} ledger(s) use {args.bookie_id}; would copy to {target}\n"
                    + _plan_text(plans, args) + "\nnothing changed").strip()
            return {"ok": True, "dry_run": True, "bookie_id": args.bookie_id, "ledgers": rows, "text": text}
        if not plans:
            return {"ok": True, "bookie_id": args.bookie_id, "ledgers": [], "recovered": [], "failed": [],
                    "text": f"no ledger uses {args.bookie_id}: nothing to recover"}
        if not args.yes:
            if not sys.stdin.isatty():
                raise IncorrectParameterError(f"{len(plans)} ledger(s) would change and stdin is not a terminal:"
                                              " confirm with --yes")
            answer = input(f"recover {len(plans)} ledger(s) of {args.bookie_id}"
                           f" ({sum(p.entries for p in plans)} entries known so far)? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                return {"ok": False, "text": "nothing changed"}
        show = _Progress(quiet=args.json)
        summary = await recovery.recover(args.bookie_id, target=args.target, skip_open=args.skip_open_ledgers,
                                         delete_cookie=args.delete_cookie, plans=plans,
                                         on_progress=show.bar, on_ledger=show.ledger)
        show.done()
    prog = summary.progress
    failed = summary.failed
    lines = [f"recovered {len(summary.by_status('recovered'))} of {prog.ledgers_total} ledger(s) of"
             f" {args.bookie_id}: {prog.entries_copied} entries, {_mb(prog.bytes_copied)} copied in"
             f" {prog.elapsed_s:.1f} s ({_mb(prog.rate_bytes_per_s)}/s)"]
    if summary.by_status("skipped-open"):
        lines.append(f"skipped (not closed): {', '.join(map(str, summary.by_status('skipped-open')))}")
    if summary.by_status("deleted"):
        lines.append(f"deleted meanwhile: {', '.join(map(str, summary.by_status('deleted')))}")
    for r in failed:
        lines.append(f"FAILED ledger {r.ledger_id}: {r.error}")
    if summary.cookie_note:
        lines.append(summary.cookie_note)
    return {"ok": summary.ok, "bookie_id": args.bookie_id, "ledgers_total": prog.ledgers_total,
            "recovered": summary.by_status("recovered"), "skipped_open": summary.by_status("skipped-open"),
            "deleted": summary.by_status("deleted"),
            "failed": [{"ledger_id": r.ledger_id, "error": r.error} for r in failed],
            "entries_copied": prog.entries_copied, "bytes_copied": prog.bytes_copied,
            "elapsed_s": round(prog.elapsed_s, 3), "cookie_deleted": summary.cookie_deleted,
            "text": "\n".join(lines)}


async def _with_urm(uri, fn):
    from bk.meta import open_store
    from bk.meta.underreplication import LedgerUnderreplicationManager

    store = await open_store(uri)
    try:
        urm = LedgerUnderreplicationManager(store)
        try:
            return await fn(urm)
        finally:
            await urm.close()
    finally:
        await store.close()


@command("autorecovery", help="enable, disable or show AutoRecovery (ledger replication)",
         args=(one_of(arg("--enable", action="store_true", help="enable ledger replication"),
                      arg("--disable", action="store_true", help="disable ledger replication"),
                      arg("--status", action="store_true", help="show its state (the default)")),))
async def cmd_autorecovery(uri, args):
    from bk.replication.admin import replication_status

    async def go(urm):
        if args.enable:
            await urm.enable_ledger_replication()
        elif args.disable:
            await urm.disable_ledger_replication()
        status = await replication_status(urm)
        status["text"] = (f"autorecovery (ledger replication) is {'enabled' if status['enabled'] else 'DISABLED'};"
                          f" auditor: {status['auditor'] or 'none'};"
                          f" lost bookie recovery delay: {status['lost_bookie_recovery_delay_s']} s;"
                          f" under-replicated ledgers: {status['underreplicated_ledgers']}")
        return status
    return await _with_urm(uri, go)


@command("lostbookierecoverydelay", help="show or set the auditor's lost-bookie delay",
         args=(arg("--set", type=int, default=None, metavar="SECONDS", help="the new delay"),))
async def cmd_lostbookierecoverydelay(uri, args):
    async def go(urm):
        if args.set is not None:
            if args.set < 0:
                raise IncorrectParameterError("--set needs a number of seconds >= 0")
            await urm.set_lost_bookie_recovery_delay(args.set)
        delay = await urm.get_lost_bookie_recovery_delay(0)
        return {"lost_bookie_recovery_delay_s": delay, "text": f"lostBookieRecoveryDelay: {delay} s"}
    return await _with_urm(uri, go)


@command("whoisauditor", help="the bookie whose AutoRecovery is the auditor")
async def cmd_whoisauditor(uri, args):
    from bk.replication.election import current_auditor

    async def go(urm):
        auditor = await current_auditor(urm.store)
        return {"auditor": auditor, "text": f"auditor: {auditor}" if auditor else "no auditor is elected"}
    return await _with_urm(uri, go)


@command("listunderreplicated", help="list ledgers marked under-replicated",
         args=(arg("--missing-replica", default=None, metavar="BOOKIE_ID", help="only those missing this bookie"),
               arg("--print-missing-replicas", action="store_true", help="each ledger's missing replicas"),
               arg("--print-worker", action="store_true", help="the worker holding each ledger's lock")))
async def cmd_listunderreplicated(uri, args):
    from bk.replication.admin import list_underreplicated

    async def go(urm):
        rows = await list_underreplicated(urm, missing_replica=args.missing_replica, with_worker=args.print_worker)
        lines = []
        for r in rows:
            line = str(r.ledger_id)
            if args.print_missing_replicas:
                line += f"\tmissing: {', '.join(r.missing_replicas)}"
            if args.print_worker:
                line += f"\tworker: {r.worker or '-'}"
            lines.append(line)
        return {"ledgers": [{"ledger_id": r.ledger_id, "missing_replicas": list(r.missing_replicas),
                             "ctime_ms": r.ctime_ms, "worker": r.worker} for r in rows],
                "text": "\n".join(lines) or "no under-replicated ledgers"}
    return await _with_urm(uri, go)


@command("triggeraudit", help="make the auditor audit every bookie now (and check placement, when its"
                                 " auditor_periodic_placement_policy_check_interval_s is set)")
async def cmd_triggeraudit(uri, args):
    from bk.replication.admin import trigger_audit
    from bk.replication.election import current_auditor

    async def go(urm):
        await trigger_audit(urm)
        auditor = await current_auditor(urm.store)
        note = (f"auditor {auditor} will audit every bookie now (and check placement if that check is on)"
                if auditor else "audit requested, but no auditor is elected (is AutoRecovery enabled on some bookie?)")
        return {"ok": True, "auditor": auditor, "text": note}
    return await _with_urm(uri, go)


@command("decommissionbookie", help="move everything off a stopped bookie, then delete its cookie",
         args=(arg("bookie_id", help="the stopped bookie, host:port"),
               arg("--timeout", type=float, default=None, metavar="SECONDS", help="give up after this long")))
async def cmd_decommissionbookie(uri, args):
    from bk.client import BookKeeper
    from bk.meta.underreplication import LedgerUnderreplicationManager
    from bk.replication.admin import decommission_bookie

    bar = progress_bar(desc=f"decommission {args.bookie_id}", unit="ledger", quiet=args.json)

    def show(remaining: int, initial: int) -> None:
        if bar.tty:
            bar.update_to(initial - remaining, initial)
        else:
            bar.note(f"{initial - remaining}/{initial} ledger(s) moved off {args.bookie_id}, {remaining} left")

    async with BookKeeper(uri) as bkc:
        urm = LedgerUnderreplicationManager(bkc.store)
        try:
            result = await decommission_bookie(bkc, urm, args.bookie_id, timeout_s=args.timeout, on_progress=show)
        finally:
            await urm.close()
    bar.close()
    result["ok"] = True
    result["text"] = (f"decommissioned {args.bookie_id}: {result['ledgers']} ledger(s) re-replicated,"
                      f" cookie {'deleted' if result['cookie_deleted'] else 'was already gone'}")
    return result

