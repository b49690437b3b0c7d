"""Fuzz targets of the metadata formats (cookies, ledger metadata and the other znode/VERSION
formats of bk/meta) and of the GC usage format (bk/entrylog/usage.py).

Contracts: a parser returns a value or raises MetadataFormatError (cookies read from a
directory: CookieError); what parses serializes and parses back to an equal value. The
usage readers raise only OSError/ValueError (read_log_metadata) or nothing at all
(log_usage_row), and their pure-Python walk of an entry log finds exactly the records the
bookie's kernel scan (bk.entrylog.files.LogScan, native and pure) finds.
"""
from __future__ import annotations

import os

from bk.formats import entrylog as efmt
from bk.entrylog import usage
from bk.entrylog.files import LogScan
from bk.errors import CookieError, MetadataFormatError
from bk.meta import formats
from bk.meta.cookie import Cookie, read_directory_cookie
from bk.meta.ledger_metadata import LedgerMetadata
from bk.meta.registration import BookieServiceInfo

from .contract import Twins, allowed, check, params
from .storage import _write, scratch

_entrylog = Twins("entrylog")


def cookie(data: bytes) -> None:
    try:
        c = Cookie.parse(data)
    except MetadataFormatError:
        c = None
    if c is not None and c.layout_version == 5:
        again = Cookie.parse(c.to_bytes())
        check(again == c, f"cookie {c!r} does not round-trip: {again!r}")
    d = scratch("cookie")
    _write(os.path.join(d, "current", "VERSION"), data)
    with allowed(CookieError):
        check(read_directory_cookie(d) == c, "the directory cookie differs from the parsed bytes")


def ledger_metadata(data: bytes) -> None:
    p, body = params(data, 1)
    try:
        md = LedgerMetadata.deserialize(data)
    except MetadataFormatError:
        md = None
    if md is not None:
        again = LedgerMetadata.deserialize(md.serialize())
        check(again == md, f"ledger metadata does not round-trip: {md!r:.300} -> {again!r:.300}")
    # the same bytes as the other formats bk reads from ZooKeeper
    with allowed(MetadataFormatError):
        formats.decode_varint32(body, p[0] % 8)
    with allowed(MetadataFormatError):
        BookieServiceInfo.deserialize(body)
    for cls in (formats.UnderreplicatedLedgerFormat, formats.LockDataFormat, formats.AuditorVoteFormat):
        with allowed(MetadataFormatError):
            formats.from_text(cls, body)
        with allowed(MetadataFormatError):
            formats.from_binary(cls, body)


def gc_usage(data: bytes) -> None:
    p, buf = params(data, 2)
    max_entry = (16, 64, 4096, 0xFFFFFFFF)[p[0] & 3]
    d = scratch("usage")
    path = os.path.join(efmt.log_dir(d), efmt.log_file_name(p[1]))
    content = efmt.encode_header(p[1]) + buf if p[0] & 4 else buf
    _write(path, content)
    row = usage.log_usage_row(path)  # documented never to raise
    check(row["source"] in ("map", "scan", "error"), f"usage row {row!r:.200}")
    try:
        meta = usage.read_log_metadata(path)
    except (OSError, ValueError):
        meta = None
    if meta is not None:
        check(meta.total_bytes == sum(meta.ledgers.values()) and 0.0 <= meta.usage <= 1.0, f"usage {meta!r:.200}")
        check(usage.EntryLogMetadata.from_dict(meta.to_dict()) == meta, "usage JSON does not round-trip")
    # the pure walk and the bookie's kernel scan agree on the records and where they stop
    report = usage.ScanReport()
    walked = [(off, lid, eid, size) for lid, eid, off, size in usage.scan_records(path, max_entry, report)]
    header, size = usage.read_header(path)
    end = header.map_offset if header is not None and 0 < header.map_offset <= size else size
    for kernel in filter(None, (_entrylog.pure, _entrylog.native)):
        scan = LogScan(kernel, path, 0, end, max_entry, chunk_bytes=64 + p[1])
        scanned = [(loc & 0xFFFFFFFF, lid, eid, sz) for lid, eid, loc, sz in scan]
        check(scanned == walked, f"usage walk {walked!r:.200} != kernel scan {scanned!r:.200}")
        check((scan.status == 0) == report.clean, f"scan status {scan.status} but walk clean={report.clean}")


TARGETS = {"cookie": cookie, "ledger_metadata": ledger_metadata, "gc_usage": gc_usage}
