"""What the analytics read from the metadata store, through bk.meta's public API only.

`read_ledgers(uri)` reads every ledger's metadata once (the driver does this; the
rows are then spread over the executors by the data source), and `bookie_http_urls`
finds each registered bookie's HTTP admin endpoint (the channel remote bookies
answer their ledgers-map rows over, and compaction plans are handed on).

Owner (`owner` column): who a ledger belongs to, from its custom metadata. Pulsar's
managed ledgers carry `application=pulsar`, `component=managed-ledger` and
`pulsar/managed-ledger=<tenant>/<namespace>/<domain>/<topic>` (cursor ledgers add
`pulsar/cursor`, schema ledgers `pulsar/schemaId`); other applications are named by
`application` (and `component`), else the ledger has no owner.
"""
from __future__ import annotations

import asyncio

import pyarrow as pa

from bk.meta import open_store
from bk.meta.ledger_manager import LedgerManager
from bk.meta.registration import RegistrationManager

SEGMENT_TYPE = pa.struct([("first_entry_id", pa.int64()), ("last_entry_id", pa.int64()),
                          ("bookies", pa.list_(pa.string()))])
LEDGERS_META_SCHEMA = pa.schema([
    ("ledger_id", pa.int64()), ("state", pa.string()), ("ensemble_size", pa.int64()),
    ("write_quorum_size", pa.int64()), ("ack_quorum_size", pa.int64()), ("last_entry_id", pa.int64()),
    ("length", pa.int64()), ("ctime_ms", pa.int64()), ("digest_type", pa.string()),
    ("segments", pa.list_(SEGMENT_TYPE)), ("custom_metadata", pa.map_(pa.string(), pa.string())),
    ("owner", pa.string()),
])
LEDGERS_META_DDL = (
    "ledger_id bigint, state string, ensemble_size bigint, write_quorum_size bigint, ack_quorum_size bigint, "
    "last_entry_id bigint, length bigint, ctime_ms bigint, digest_type string, "
    "segments array<struct<first_entry_id: bigint, last_entry_id: bigint, bookies: array<string>>>, "
    "custom_metadata map<string, string>, owner string")


def owner_of(custom: dict[str, str]) -> str | None:
    name = custom.get("pulsar/managed-ledger")
    if name:
        cursor = custom.get("pulsar/cursor")
        return f"pulsar:{name}" + (f" (cursor {cursor})" if cursor else "")
    if custom.get("pulsar/schemaId"):
        return f"pulsar:schema {custom['pulsar/schemaId']}"
    app = custom.get("application")
    if app:
        return app + (f"/{custom['component']}" if custom.get("component") else "")
    return None


def ledger_row(ledger_id: int, md) -> dict:
    """One LEDGERS_META_SCHEMA row of a bk.meta LedgerMetadata. A segment's last entry is
    the next one's first - 1; the last segment's is the ledger's last entry when closed,
    null while the ledger is open (its end is not known yet)."""
    segments = []
    for i, (first, bookies) in enumerate(md.segments):
        last = md.segment_end(i)
        open_ended = i + 1 == len(md.segments) and not md.is_closed
        segments.append({"first_entry_id": first, "last_entry_id": None if open_ended else last,
                         "bookies": list(bookies)})
    custom = {k: v.decode("utf-8", "replace") for k, v in md.custom_metadata}
    return {"ledger_id": ledger_id, "state": md.state.name, "ensemble_size": md.ensemble_size,
            "write_quorum_size": md.write_quorum_size, "ack_quorum_size": md.ack_quorum_size,
            "last_entry_id": md.last_entry_id, "length": md.length, "ctime_ms": md.ctime,
            "digest_type": md.digest_type.name if md.digest_type is not None else None,
            "segments": segments, "custom_metadata": list(custom.items()), "owner": owner_of(custom)}


async def _read_ledgers(uri: str) -> list[dict]:
    store = await open_store(uri)
    try:
        manager = LedgerManager(store)
        return [ledger_row(lid, md) async for lid, md, _v in manager.iter_ledger_metadata()]
    finally:
        await store.close()


def read_ledgers(uri: str) -> list[dict]:
    """Every ledger's row; a store error raises (an unreadable store never reads as 'no ledgers':
    every byte would look reclaimable)."""
    return asyncio.run(_read_ledgers(uri))


def rows_to_batch(rows: list[dict]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=LEDGERS_META_SCHEMA)


async def _bookie_http_urls(uri: str) -> dict[str, str | None]:
    store = await open_store(uri)
    try:
        reg = RegistrationManager(store)
        out: dict[str, str | None] = {}
        for bookie_id in sorted({*await reg.writable_bookies(), *await reg.readonly_bookies()}):
            info = await reg.get_service_info(bookie_id)
            out[bookie_id] = info.http_url() if info is not None else None
        return out
    finally:
        await store.close()


def bookie_http_urls(uri: str) -> dict[str, str | None]:
    """bookie id -> its HTTP admin base URL (None: registered without one) for every
    registered bookie (writable and read-only)."""
    return asyncio.run(_bookie_http_urls(uri))
