"""A v3 test client written from BookkeeperProtocol.proto's facts alone (field numbers, types,
enum values), with its own protobuf wire encoder: it shares no code with bk.proto, so a bug
in bk's codec cannot hide behind the same bug here.

Messages are lists of (field number, value): an int is a varint (int64 negatives as 10-byte
two's complement), bytes/str a length-delimited field, a list a nested message. Decoded
messages are {field number: [raw values]}: ints for varints, bytes for length-delimited.
"""
from __future__ import annotations

import asyncio
import ssl
import struct

# BookkeeperProtocol.proto facts
VERSION_THREE = 3
OP = dict(READ_ENTRY=1, ADD_ENTRY=2, RANGE_READ_ENTRY=3, AUTH=5, WRITE_LAC=6, READ_LAC=7, GET_BOOKIE_INFO=8,
          START_TLS=9, FORCE_LEDGER=10, GET_LIST_OF_ENTRIES_OF_LEDGER=11)
STATUS = dict(EOK=0, ENOLEDGER=402, ENOENTRY=403, EBADREQ=404, EIO=501, EUA=502, EBADVERSION=503, EFENCED=504,
              EREADONLY=505, ETOOMANYREQUESTS=506, EUNKNOWNLEDGERSTATE=507)
# Request fields: header=1, readRequest=100, addRequest=101, authRequest=102, writeLacRequest=103,
# readLacRequest=104, getBookieInfoRequest=105, startTLSRequest=106, forceLedgerRequest=107,
# getListOfEntriesOfLedgerRequest=108; Response: header=1, status=2, bodies at the same numbers.
BODY = dict(READ_ENTRY=100, ADD_ENTRY=101, AUTH=102, WRITE_LAC=103, READ_LAC=104, GET_BOOKIE_INFO=105,
            START_TLS=106, FORCE_LEDGER=107, GET_LIST_OF_ENTRIES_OF_LEDGER=108)


def varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode(fields) -> bytes:
    out = bytearray()
    for num, value in fields:
        if isinstance(value, bool) or isinstance(value, int):
            out += varint(num << 3) + varint(int(value))
        else:
            data = encode(value) if isinstance(value, list) else (value.encode() if isinstance(value, str) else value)
            out += varint(num << 3 | 2) + varint(len(data)) + data
    return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    v = shift = 0
    while True:
        b = data[pos]
        pos += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, pos


def decode(data: bytes) -> dict:
    out: dict = {}
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(data, pos)
        elif wire == 2:
            n, pos = _read_varint(data, pos)
            value, pos = data[pos:pos + n], pos + n
        else:
            raise ValueError(f"wire type {wire} in a BookKeeper message")
        out.setdefault(num, []).append(value)
    return out


def signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def one(msg: dict, num: int, default=None):
    vals = msg.get(num)
    return vals[-1] if vals else default


def request(op: str, txn_id: int, body: list | None, body_op: str | None = None) -> bytes:
    """A framed Request: header {version 3, operation, txnId} and the op's body (None: no body)."""
    fields = [(1, [(1, VERSION_THREE), (2, OP[op]), (3, txn_id)])]
    if body is not None:
        fields.append((BODY[body_op or op], body))
    data = encode(fields)
    return struct.pack(">i", len(data)) + data


class Answer:
    """A decoded Response: header, status and the body of its operation."""

    def __init__(self, raw: bytes):
        self.raw = raw
        msg = decode(raw)
        header = decode(one(msg, 1))
        self.version, self.op, self.txn_id = one(header, 1), one(header, 2), one(header, 3)
        self.status = one(msg, 2)
        name = next((k for k, v in OP.items() if v == self.op), None)
        body = one(msg, BODY.get(name, 0))
        self.body = decode(body) if body is not None else None

    def field(self, num, default=None):
        return one(self.body, num, default) if self.body is not None else default

    def __repr__(self):
        return f"Answer(op={self.op}, txn={self.txn_id}, status={self.status}, body={self.body})"


class V3Client:
    """One raw v3 connection (optionally upgraded to TLS by START_TLS)."""

    def __init__(self, port: int, host: str = "127.0.0.1"):
        self.host, self.port = host, port
        self.buf = b""
        self.txn = 0

    async def __aenter__(self):
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def __aexit__(self, *exc):
        self.writer.close()

    def send(self, data: bytes):
        self.writer.write(data)

    def next_txn(self) -> int:
        self.txn += 1
        return self.txn

    async def frame(self, timeout=10) -> bytes:
        while True:
            if len(self.buf) >= 4:
                (n,) = struct.unpack_from(">i", self.buf)
                if len(self.buf) >= 4 + n:
                    out, self.buf = self.buf[4:4 + n], self.buf[4 + n:]
                    return out
            chunk = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not chunk:
                raise ConnectionError("closed by the bookie")
            self.buf += chunk

    async def answers(self, n=1, timeout=10) -> list[Answer]:
        return [Answer(await self.frame(timeout)) for _ in range(n)]

    async def call(self, op: str, body, body_op=None) -> Answer:
        txn = self.next_txn()
        self.send(request(op, txn, body, body_op))
        (a,) = await self.answers()
        assert a.txn_id == txn and a.version == VERSION_THREE, a
        return a

    async def closed_by_peer(self, timeout=10) -> bool:
        try:
            while True:
                if not await asyncio.wait_for(self.reader.read(65536), timeout):
                    return True
        except (ConnectionResetError, ssl.SSLError):
            return True

    async def start_tls(self, context: ssl.SSLContext, server_hostname: str) -> Answer:
        a = await self.call("START_TLS", [])
        if a.status == STATUS["EOK"]:
            await self.writer.start_tls(context, server_hostname=server_hostname)
        return a


# ---------------------------------------------------------------- bodies (field numbers of the .proto)
def add_body(ledger_id, entry_id, key, body, recovery=False):
    fields = [(1, ledger_id), (2, entry_id), (3, key), (4, body)]
    return fields + ([(100, 1)] if recovery else [])


def read_body(ledger_id, entry_id, *, fence_key=None, previous_lac=None, timeout_ms=None, piggyback=False):
    fields = [(1, ledger_id), (2, entry_id)]
    if fence_key is not None:
        fields += [(100, 1), (3, fence_key)]
    if piggyback:
        fields.append((100, 2))
    if previous_lac is not None:
        fields.append((4, previous_lac))
    if timeout_ms is not None:
        fields.append((5, timeout_ms))
    return fields


def availability(data: bytes) -> list[int]:
    """Entry ids of BookKeeper's AvailabilityOfEntriesOfLedger bytes (64-byte header, 24-byte groups)."""
    version, count = struct.unpack_from(">ii", data)
    assert version == 0
    out = []
    for i in range(count):
        first, last, size, period = struct.unpack_from(">qqii", data, 64 + 24 * i)
        start = first
        while True:
            out += range(start, start + size)
            if start >= last:
                break
            start += period
    return out


def sync_start_tls(port: int, context: ssl.SSLContext, server_hostname: str, host: str = "127.0.0.1"):
    """A blocking START_TLS and handshake (stdlib ssl: errors are raised as the handshake sees them)."""
    import socket
    sock = socket.create_connection((host, port), timeout=10)
    try:
        sock.sendall(request("START_TLS", 1, []))
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + struct.unpack_from(">i", buf)[0]:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed by the bookie")
            buf += chunk
        answer = Answer(buf[4:])
        assert answer.status == STATUS["EOK"], answer
        return context.wrap_socket(sock, server_hostname=server_hostname)
    except BaseException:
        sock.close()
        raise
