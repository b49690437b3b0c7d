"""`bk shell` operator commands against the metadata store and the bookies.

    bookieinfo [BOOKIE_ID]          state, free/total space and HTTP admin address of bookies
    clusterinfo                     bookie counts, auditor, replication, under-replicated ledgers
    whatisinstanceid                the cluster's instance id
    bookiesanity [--bookie ID]      write and read back a small ledger on that bookie alone
    queryautorecoverystatus         under-replicated ledgers with their missing replicas and workers
    nukeexistingcluster --instance-id ID   delete every znode of the cluster (guarded)

`readledger --bookie ID` and `ledgermetadata --dump/--restore` are handled in
bk.cli.shell with helpers from here.
"""
from __future__ import annotations

import asyncio
import os

from bk.client.placement import OneBookiePlacement
from bk.errors import BKError, IncorrectParameterError
from bk.formats.wire import BOOKIE_INFO_FREE_DISK_SPACE, BOOKIE_INFO_TOTAL_DISK_CAPACITY

from .commands import arg, command_table

COMMANDS, command = command_table()
BOOKIE_INFO_TIMEOUT_S = 5.0


async def _with_client(uri, fn):
    from bk.client import BookKeeper
    async with BookKeeper(uri) as bkc:
        return await fn(bkc)


async def bookie_space(bkc, bookie_id: str) -> tuple[int | None, int | None]:
    """(free, total) bytes a bookie reports over the wire (GetBookieInfo), or (None, None)."""
    client = bkc.pool.get(bookie_id)
    try:
        async with asyncio.timeout(BOOKIE_INFO_TIMEOUT_S):
            resp = await client.call(client.send_bookie_info,
                                     BOOKIE_INFO_FREE_DISK_SPACE | BOOKIE_INFO_TOTAL_DISK_CAPACITY)
    except Exception:  # noqa: BLE001 - unreachable: reported as unknown
        return None, None
    return resp.free_disk_bytes, resp.total_disk_bytes


def _http_url(info) -> str | None:
    return info.http_url() if info is not None else None


@command("bookieinfo", help="state, free/total disk space and HTTP address of the bookies",
         args=(arg("bookie_id", nargs="?", default=None, help="one bookie (default: every registered bookie)"),))
async def cmd_bookieinfo(uri, args):
    async def go(bkc):
        reg = bkc.registration
        writable, readonly = set(await reg.writable_bookies()), set(await reg.readonly_bookies())
        bookies = sorted(writable | readonly)
        if args.bookie_id is not None:
            if args.bookie_id not in bookies:
                raise BKError(f"bookie {args.bookie_id} is not registered (not running)")
            bookies = [args.bookie_id]
        rows = []
        for b in bookies:
            free, total = await bookie_space(bkc, b)
            info = await reg.get_service_info(b)
            rows.append({"bookie_id": b, "state": "read-only" if b in readonly else "writable",
                         "free_bytes": free, "total_bytes": total, "http": _http_url(info)})
        gb = lambda n: "?" if n is None else f"{n / 1e9:.1f} GB"  # noqa: E731
        text = "\n".join(f"{r['bookie_id']}\t{r['state']}\tfree {gb(r['free_bytes'])} of {gb(r['total_bytes'])}"
                         f"\tHTTP {r['http'] or '-'}" for r in rows) or "no bookies registered"
        return {"bookies": rows, "text": text}
    return await _with_client(uri, go)


@command("clusterinfo", help="bookie counts, auditor, replication state, under-replicated ledgers")
async def cmd_clusterinfo(uri, args):
    from bk.meta.cluster import read_instance_id
    from bk.meta.underreplication import LedgerUnderreplicationManager
    from bk.replication.election import current_auditor

    async def go(bkc):
        reg = bkc.registration
        writable, readonly = set(await reg.writable_bookies()), set(await reg.readonly_bookies())
        known = set(await reg.known_bookies())
        urm = LedgerUnderreplicationManager(bkc.store)
        try:
            auditor = await current_auditor(bkc.store)
            enabled = await urm.is_ledger_replication_enabled()
            underreplicated = len(await urm.list_underreplicated_ledgers())
        finally:
            await urm.close()
        d = {"instance_id": await read_instance_id(bkc.store), "auditor": auditor,
             "ledger_replication_enabled": enabled, "underreplicated_ledgers": underreplicated,
             "ledgers": len(await bkc.list_ledgers()), "total_bookies": len(known | writable | readonly),
             "writable_bookies": len(writable), "readonly_bookies": len(readonly),
             "unavailable_bookies": len(known - writable - readonly)}
        d["text"] = "\n".join([
            f"instance id        {d['instance_id']}",
            f"bookies            {d['total_bookies']} ({d['writable_bookies']} writable, {d['readonly_bookies']}"
            f" read-only, {d['unavailable_bookies']} unavailable)",
            f"ledgers            {d['ledgers']} ({underreplicated} under-replicated)",
            f"auditor            {auditor or 'none elected'}",
            f"ledger replication {'enabled' if enabled else 'DISABLED'}"])
        return d
    return await _with_client(uri, go)


@command("whatisinstanceid", help="the cluster's instance id")
async def cmd_whatisinstanceid(uri, args):
    from bk.meta import open_store
    from bk.meta.cluster import read_instance_id

    store = await open_store(uri)
    try:
        instance = await read_instance_id(store)
    finally:
        await store.close()
    return {"instance_id": instance, "text": f"instance id: {instance}"}


@command("bookiesanity", help="write and read back a small ledger on one bookie alone",
         args=(arg("--bookie", default=None, help="the bookie (default: the one --conf describes)"),
               arg("--entries", type=int, default=10, help="entries to write and read back (default 10)")))
async def cmd_bookiesanity(uri, args):
    from bk.client import BookKeeper

    bookie = args.bookie
    if bookie is None:
        if not args.conf:
            raise IncorrectParameterError("name the bookie: --bookie HOST:PORT (or --conf of the local bookie)")
        from bk.config import load_config
        bookie = load_config(args.conf).bookie_id
    if args.entries < 1:
        raise IncorrectParameterError("--entries must be at least 1")
    payloads = [os.urandom(64) for _ in range(args.entries)]
    async with BookKeeper(uri, placement=OneBookiePlacement(bookie), add_timeout_s=10) as bkc:
        lh = await bkc.create_ledger(1, 1, 1)
        try:
            for p in payloads:
                await lh.add_entry(p)
            await lh.close()
            rh = await bkc.open_ledger(lh.ledger_id, recovery=False)
            got = [bytes(e.data) for e in await rh.read_entries(0, args.entries - 1)]
        finally:
            await bkc.delete_ledger(lh.ledger_id)
    if got != payloads:
        raise BKError(f"bookie {bookie} returned different data than was written (ledger {lh.ledger_id})")
    return {"ok": True, "bookie_id": bookie, "entries": args.entries,
            "text": f"bookie sanity test succeeded on {bookie}: {args.entries} entries written and read back"}


@command("queryautorecoverystatus", help="under-replicated ledgers, their missing replicas and workers")
async def cmd_queryautorecoverystatus(uri, args):
    from bk.meta import open_store
    from bk.meta.underreplication import LedgerUnderreplicationManager
    from bk.replication.admin import list_underreplicated

    store = await open_store(uri)
    try:
        urm = LedgerUnderreplicationManager(store)
        try:
            enabled = await urm.is_ledger_replication_enabled()
            rows = await list_underreplicated(urm, with_worker=True)
        finally:
            await urm.close()
    finally:
        await store.close()
    ledgers = [{"ledger_id": r.ledger_id, "missing_replicas": list(r.missing_replicas), "worker": r.worker,
                "ctime_ms": r.ctime_ms} for r in rows]
    lines = [f"ledger replication {'enabled' if enabled else 'DISABLED'};"
             f" {len(ledgers)} under-replicated ledger(s)"]
    lines += [f"ledger {r['ledger_id']}: missing {', '.join(r['missing_replicas'])};"
              f" {'being replicated by ' + r['worker'] if r['worker'] else 'waiting for a worker'}" for r in ledgers]
    return {"ledger_replication_enabled": enabled, "ledgers": ledgers, "text": "\n".join(lines)}


@command("nukeexistingcluster", help="delete every znode of the cluster (all metadata!)",
         args=(arg("--instance-id", required=True, help="the cluster's instance id (whatisinstanceid), as a guard"),
               arg("--force", action="store_true", help="even with bookies registered")))
async def cmd_nukeexistingcluster(uri, args):
    """Delete the whole metadata root, only when --instance-id matches it (and no bookie is
    registered, unless --force): the ids guard against nuking the wrong cluster."""
    from bk.meta import open_store
    from bk.meta.cluster import paths_for, read_instance_id
    from bk.meta.registration import RegistrationManager

    store = await open_store(uri)
    try:
        instance = await read_instance_id(store)
        if args.instance_id != instance:
            raise BKError(f"instance id {args.instance_id!r} does not match the cluster's ({instance!r}) at {uri}:"
                          " nothing deleted")
        rm = RegistrationManager(store)
        try:
            registered = sorted({*await rm.writable_bookies(), *await rm.readonly_bookies()})
        finally:
            await rm.close()
        if registered and not args.force:
            raise BKError(f"bookies are running ({', '.join(registered)}): stop them first, or --force;"
                          " nothing deleted")
        root = paths_for(store).root
        await store.delete(root, recursive=True)
    finally:
        await store.close()
    return {"ok": True, "instance_id": instance, "deleted": root,
            "text": f"deleted cluster {instance}: every znode under {root}"}


async def read_from_bookie(uri, ledger_id: int, bookie_id: str, first: int, last: int | None) -> list:
    """[(entry_id, payload)] read from ONE bookie, each checked against the ledger's digest."""
    from bk.client import BookKeeper
    from bk.errors import NoSuchEntryError, NoSuchLedgerError, error_for_code
    from bk.proto.digest import DigestManager

    async with BookKeeper(uri) as bkc:
        md = await bkc.get_ledger_metadata(ledger_id)
        if bookie_id not in md.bookies():
            raise BKError(f"bookie {bookie_id} is in no ensemble of ledger {ledger_id}")
        digest = DigestManager(ledger_id, int(md.digest_type) if md.digest_type is not None else "CRC32C",
                               md.password or b"")
        client = bkc.pool.get(bookie_id)
        if last is None:
            last = md.last_entry_id if md.is_closed else None
        out, entry_id = [], first
        while last is None or entry_id <= last:
            resp = await client.call(client.send_read, ledger_id, entry_id)
            if resp.rc == NoSuchEntryError.code or (resp.rc == NoSuchLedgerError.code and last is not None):
                if last is None:
                    break  # an open ledger: read up to the bookie's last entry
                entry_id += 1  # not on this bookie (another member of the write set has it)
                continue
            if resp.rc != 0:
                raise error_for_code(resp.rc, f"bookie {bookie_id}", ledger_id=ledger_id, entry_id=entry_id)
            _lac, _length, payload = digest.verify_entry(entry_id, resp.body)
            out.append((entry_id, bytes(payload)))
            entry_id += 1
    return out
