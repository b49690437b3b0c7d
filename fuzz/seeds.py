"""The seed corpus: frames and files made by bk's own encoders and writers (`python -m fuzz seed`).

Each seed starts with the target's parameter bytes (fuzz.contract.params: frame/record size
limits, split points) chosen so the rest is read as bk wrote it. Seeds are small (a few KB per
target) and deterministic, so regenerating gives the same files.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile

from bk.config import load_config
from bk.entrylog import EntryLogger
from bk.formats import entrylog as efmt
from bk.index.state import LedgerState, encode_log_mark, flag_key, location_key, log_mark_key, compacting_log_key
from bk.journal import records as jrec
from bk.journal.records import LogMark
from bk.meta.cookie import Cookie
from bk.meta.ledger_metadata import LedgerMetadata
from bk.meta.registration import BookieServiceInfo, Endpoint
from bk.proto import codec, messages as m, v3
from bk.proto.digest import DigestManager, DigestType
from bk.formats.wire import FLAG_DO_FENCING, FLAG_RECOVERY_ADD
from bk.proto.masterkey import master_key

import fuzz
from bk import _native

KEY = master_key(b"fuzz")
_DEFAULT_FRAME = 5  # fuzz.wire._MAX_FRAMES[5]: the default max frame size


def _entry(ledger_id: int, entry_id: int, payload: bytes, digest=DigestType.CRC32C) -> bytes:
    return DigestManager(ledger_id, digest, b"fuzz").frame_entry(entry_id, entry_id - 1, len(payload), payload)


def v2_requests() -> list[bytes]:
    msgs = [m.AddRequest(0, KEY, 7, 3, _entry(7, 3, b"hello")),
            m.AddRequest(FLAG_RECOVERY_ADD, KEY, 7, 4, _entry(7, 4, b"x" * 40, DigestType.HMAC)),
            m.ReadRequest(0, 7, 3), m.ReadRequest(FLAG_DO_FENCING, 7, -1, KEY),
            m.BatchReadRequest(0, 7, 0, 99, 10, 65536), m.AuthRequest(0, b"\x00\x04test"),
            m.ReadLacRequest(0, 7), m.GetBookieInfoRequest(0, 3),
            m.WriteLacRequest(0, KEY, 7, 2, DigestManager(7, DigestType.CRC32C, b"fuzz").digest(
                (7).to_bytes(8, "big") + (2).to_bytes(8, "big")).join([(7).to_bytes(8, "big") + (2).to_bytes(8, "big"), b""]))]
    frames = [codec.encode_request(x) for x in msgs]
    return [bytes([_DEFAULT_FRAME, 13]) + f for f in frames] + [bytes([_DEFAULT_FRAME, 100]) + b"".join(frames)]


def v2_responses() -> list[bytes]:
    msgs = [m.AddResponse(0, 7, 3), m.AddResponse(103, 7, 4), m.ReadResponse(0, 7, 3, _entry(7, 3, b"hi")),
            m.ReadResponse(-7, 7, 9), m.BatchReadResponse(0, 7, 0, 99, [_entry(7, 0, b"a"), _entry(7, 1, b"bb")]),
            m.AuthResponse(b"\x00\x04test"), m.ReadLacResponse(0, 7, b"L" * 20, _entry(7, 2, b"c")),
            m.WriteLacResponse(0, 7), m.GetBookieInfoResponse(0, 1 << 30, 1 << 40)]
    frames = [codec.encode_response(x) for x in msgs]
    return [bytes([_DEFAULT_FRAME, 13]) + f for f in frames] + [bytes([_DEFAULT_FRAME, 77]) + b"".join(frames)]


def _v3_request(op, body_name, txn=5, **fields):
    req = v3.Request()
    req.header.version = 3
    req.header.operation = op
    req.header.txnId = txn
    body = getattr(req, body_name)
    for k, val in fields.items():
        setattr(body, k, val)
    if not fields:
        body.SetInParent()
    return v3.frame(req)


def v3_requests() -> list[bytes]:
    O = v3.OperationType
    add = v3.v3_add_request_from_v2(codec.encode_request(m.AddRequest(0, KEY, 7, 3, _entry(7, 3, b"hello"))), 1)
    recovery = v3.v3_add_request_from_v2(codec.encode_request(
        m.AddRequest(FLAG_RECOVERY_ADD, KEY, 7, 4, _entry(7, 4, b"r"))), 2)
    frames = [add, recovery,
              _v3_request(O.READ_ENTRY, "readRequest", ledgerId=7, entryId=3),
              _v3_request(O.READ_ENTRY, "readRequest", ledgerId=7, entryId=-1, flag=1, masterKey=KEY),
              _v3_request(O.READ_LAC, "readLacRequest", ledgerId=7),
              _v3_request(O.WRITE_LAC, "writeLacRequest", ledgerId=7, lac=2, masterKey=KEY, body=b"\0" * 20),
              _v3_request(O.GET_BOOKIE_INFO, "getBookieInfoRequest", requested=3),
              _v3_request(O.FORCE_LEDGER, "forceLedgerRequest", ledgerId=7),
              _v3_request(O.GET_LIST_OF_ENTRIES_OF_LEDGER, "getListOfEntriesOfLedgerRequest", ledgerId=7),
              _v3_request(O.START_TLS, "startTLSRequest")]
    v2_add = codec.encode_request(m.AddRequest(0, KEY, 7, 3, _entry(7, 3, b"hello")))
    v2_read = codec.encode_request(m.ReadRequest(0, 7, 3))  # what a client's v3 connection converts
    return ([bytes([_DEFAULT_FRAME, 13, 1]) + f for f in frames] + [bytes([_DEFAULT_FRAME, 50, 1]) + b"".join(frames)]
            + [bytes([_DEFAULT_FRAME, 9, 3]) + v2_add, bytes([_DEFAULT_FRAME, 9, 3]) + v2_read])


def v3_responses() -> list[bytes]:
    reqs = [v3.V3AddRequest(0, KEY, 7, e, b"", 3, 10 + e, 0) for e in range(3)]
    frames = [v3.encode_add_responses(reqs[:1], 0), v3.encode_add_responses(reqs[1:], 103)]
    O = v3.OperationType
    for op, name, fields in ((O.READ_ENTRY, "readResponse", dict(ledgerId=7, entryId=3, body=_entry(7, 3, b"hi"))),
                             (O.READ_LAC, "readLacResponse", dict(ledgerId=7, lacBody=b"L" * 20)),
                             (O.WRITE_LAC, "writeLacResponse", dict(ledgerId=7)),
                             (O.GET_BOOKIE_INFO, "getBookieInfoResponse", dict(freeDiskSpace=5, totalDiskCapacity=9)),
                             (O.GET_LIST_OF_ENTRIES_OF_LEDGER, "getListOfEntriesOfLedgerResponse",
                              dict(ledgerId=7, availabilityOfEntriesOfLedger=v3.encode_entries_availability(
                                  [0, 1, 2, 5, 6, 9])))):
        resp = v3.Response()
        resp.header.version, resp.header.operation, resp.header.txnId = 3, op, 4
        resp.status = 0
        body = getattr(resp, name)
        body.status = 0
        for k, val in fields.items():
            setattr(body, k, val)
        frames.append(v3.frame(resp))
    avail = v3.encode_entries_availability([0, 1, 2, 3, 10, 11, 40])
    return ([bytes([_DEFAULT_FRAME, 13]) + f for f in frames] + [bytes([_DEFAULT_FRAME, 60]) + b"".join(frames)]
            + [bytes([_DEFAULT_FRAME, 0]) + avail])


def journal_records() -> list[bytes]:
    k = _native.load_pure("journal")
    bodies = [_entry(7, e, b"j" * (e * 5)) for e in range(4)]
    metas = [jrec.meta_body(7, jrec.MASTER_KEY, KEY), jrec.meta_body(7, jrec.FENCE),
             jrec.meta_body(7, jrec.EXPLICIT_LAC, b"\0" * 40)]
    whole = k.frame_records(metas[:1] + bodies + metas[1:])
    torn = whole[:-5]
    return [bytes([4, 0]) + whole, bytes([4, 2]) + torn, bytes([4, 1]) + jrec.encode_header(0) + whole,
            bytes([6, 0]) + k.frame_records(bodies[:2]) + b"\0" * 12 + k.frame_records(bodies[2:])]


def _entry_log_files(close: bool) -> list[bytes]:
    d = tempfile.mkdtemp(prefix="bk-fuzz-seed-")
    try:
        cfg = load_config(overrides=dict(ledger_dirs=[d]), env={})
        el = EntryLogger([d], cfg)
        el.add_entries([_entry(lid, e, bytes([e]) * (e * 7)) for lid in (3, 9) for e in range(5)])
        el.flush()
        if close:
            el.close()
        path = el.log_path(0)
        with open(path, "rb") as f:
            data = f.read()
        if not close:
            el.close()
        return [data]
    finally:
        shutil.rmtree(d, ignore_errors=True)


def entry_logs() -> list[bytes]:
    closed, = _entry_log_files(True)
    unclosed = closed[:-30]  # cut into the map: a log whose header names a map that is torn
    records = closed[efmt.LOG_HEADER_BYTES:efmt.decode_header(closed).map_offset]
    return [bytes([4, 0]) + closed, bytes([4, 2]) + unclosed, bytes([4, 1]) + records]


def index_records() -> list[bytes]:
    def rec(db, key, value):
        return bytes([db, len(key)]) + key + bytes([len(value)]) + value
    loc = [rec(0, location_key(7, e), (((1 << 32) | (1024 + 40 * e))).to_bytes(8, "big")) for e in range(4)]
    led = [rec(1, (7).to_bytes(8, "big"), LedgerState(fenced=True, master_key=KEY).encode()),
           rec(1, (8).to_bytes(8, "big"), LedgerState(limbo=True, explicit_lac=b"\1" * 30).encode())]
    state = [rec(2, flag_key("unclean_shutdown"), b"1"), rec(2, log_mark_key(0), encode_log_mark(LogMark(3, 4096))),
             rec(2, compacting_log_key(5), b"")]
    return [b"\0" + b"".join(loc + led + state), b"\3" + b"".join(loc[:2]), b"\0" + LedgerState(master_key=KEY).encode()]


def cookies() -> list[bytes]:
    return [Cookie("127.0.0.1:3181", ("/j",), ("/l1", "/l2"), "abc-123", None).to_bytes(),
            Cookie("bk1:3181", ("/j1", "/j2"), ("/l",), None, ("/i",)).to_bytes(),
            b"3\nbk1:3181\n/j\n1\t/l\n"]


def ledger_metadatas() -> list[bytes]:
    md = LedgerMetadata.new(["b1:3181", "b2:3181", "b3:3181"], 2, 2, password=b"pw", ctime_ms=1,
                            custom_metadata={"app": b"fuzz"})
    md = md.replace(ctoken=7)
    closed = md.with_ensemble_change(10, ["b1:3181", "b4:3181", "b3:3181"]).with_closed(20, 4096)
    info = BookieServiceInfo((Endpoint("bookie", "127.0.0.1", 3181, "bookie-rpc", (), ()),), {"k": "v"})
    return [md.serialize(), closed.serialize(), b"\0" + info.serialize(),
            b"\0replica: \"b1:3181\"\nctime: 5\n"]


def usage_logs() -> list[bytes]:
    closed, = _entry_log_files(True)
    return [bytes([3, 0]) + closed, bytes([3, 1]) + closed[:-40], bytes([7, 2]) + closed[efmt.LOG_HEADER_BYTES:1400]]


SEEDS = {"v2_request": v2_requests, "v2_response": v2_responses, "v3_request": v3_requests,
         "v3_response": v3_responses, "journal": journal_records, "entrylog": entry_logs, "index": index_records,
         "cookie": cookies, "ledger_metadata": ledger_metadatas, "gc_usage": usage_logs}


def write_corpus(root: str = fuzz.CORPUS_DIR) -> None:
    for name in fuzz.target_names():
        d = os.path.join(root, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        total = 0
        for i, data in enumerate(SEEDS[name]()):
            with open(os.path.join(d, f"seed-{i:02d}-{hashlib.sha1(data).hexdigest()[:12]}"), "wb") as f:
                f.write(data)
            total += len(data)
        print(f"{name}: {len(os.listdir(d))} seeds, {total} bytes")
