"""Pure-Python twin of bk/_native/_reads.pyx: the answers to a run of single READs.

read_answers(rows, header) -> bytes
    One v2 READ response frame per `(ledger_id, entry_id, entry)` row, rc EOK, back to back
    in one buffer; `header` is the v2 header int of the answers (layout.pack_header of the
    requests' version and READ_ENTRY).
v3_read_answers(rows) -> bytes
    One v3 READ Response frame per `(header, ledger_id, entry_id, entry)` row, back to back:
    Response{header (the request's BKPacketHeader, serialized: echoed as it came), status EOK,
    readResponse{status EOK, ledgerId, entryId, body}}, exactly the protobuf library's bytes
    for that message (tests hold both kernels to it).
v3_read_head(header, ledger_id, entry_id, entry_len) -> bytes
    The first bytes of such a frame, up to and including the body's length: the frame is
    head + entry (a large entry goes to the writev as a part of its own, uncopied).
Ids must fit in signed 64 bits (OverflowError).
"""
from __future__ import annotations


import bk.formats.wire as _L

from .codec_v3_py import _put_varint as _varint

_U64 = (1 << 64) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_ANSWER_HEAD = _L.RESPONSE_IDS_FRAME  # length header rc ledger_id entry_id
# BookkeeperProtocol.proto's field numbers (bk/proto/v3.py declares the same): Response.header 1,
# .status 2, .readResponse 100; ReadResponse.status 1, .ledgerId 2, .entryId 3, .body 4
_LEN, _VARINT = _L.V3_WIRE_LEN, _L.V3_WIRE_VARINT
_TAG_HEADER = (_L.V3_FIELD_HEADER << 3) | _LEN
_TAG_STATUS = (_L.V3_FIELD_STATUS << 3) | _VARINT
_TAG_READ = (100 << 3) | _LEN
_TAG_R_STATUS, _TAG_R_LEDGER, _TAG_R_ENTRY, _TAG_R_BODY = (1 << 3) | _VARINT, (2 << 3) | _VARINT, (3 << 3) | _VARINT, \
    (4 << 3) | _LEN




def _check_ids(ledger_id: int, entry_id: int) -> None:
    if not (_I64_MIN <= ledger_id <= _I64_MAX and _I64_MIN <= entry_id <= _I64_MAX):
        raise OverflowError("ledger and entry ids must fit in signed 64 bits")


def read_answers(rows, header: int) -> bytes:
    out = []
    fixed = _L.READ_RESPONSE_HEADER_BYTES
    pack = _ANSWER_HEAD.pack
    for ledger_id, entry_id, entry in rows:
        _check_ids(ledger_id, entry_id)
        out.append(pack(fixed + len(entry), header, 0, ledger_id, entry_id))
        out.append(entry)
    return b"".join(out)


def v3_read_head(header: bytes, ledger_id: int, entry_id: int, entry_len: int) -> bytes:
    _check_ids(ledger_id, entry_id)
    v = _varint
    read = (v(_TAG_R_STATUS) + b"\x00" + v(_TAG_R_LEDGER) + v(ledger_id & _U64) + v(_TAG_R_ENTRY)
            + v(entry_id & _U64) + v(_TAG_R_BODY) + v(entry_len))
    head = v(_TAG_HEADER) + v(len(header)) + bytes(header) + v(_TAG_STATUS) + b"\x00" + v(_TAG_READ) \
        + v(len(read) + entry_len) + read
    return _L.FRAME_LENGTH.pack(len(head) + entry_len) + head


def v3_read_answers(rows) -> bytes:
    out = []
    for header, ledger_id, entry_id, entry in rows:
        out.append(v3_read_head(header, ledger_id, entry_id, len(entry)))
        out.append(entry)
    return b"".join(out)
