"""Entry digests: the client frames every entry it writes and checks every entry it reads.

Digest-framed entry (PROTOCOL.md; the layout is bk/formats/entry.py's, which also frames and
checks CRC entries without native code for spark/):
    ledger_id(8) entry_id(8) last_add_confirmed(8) length(8) digest(N) payload
The digest covers the 32-byte header followed by the payload (the digest bytes
themselves are skipped):
    CRC32   8 bytes, zlib CRC32 as an unsigned 64-bit big-endian integer
    CRC32C  4 bytes, big-endian
    MAC    20 bytes, HMAC-SHA1 keyed with SHA-1(b"mac" + password)
    DUMMY   0 bytes
Explicit LAC buffer: ledger_id(8) lac(8) digest(N), digest over the 16 bytes.

Bookies store these bytes untouched; only the client computes digests. A reader
that finds a bad digest or foreign ids gets DigestMismatchError and reads
another replica.
"""
from __future__ import annotations

import hashlib
import hmac
import struct
import zlib

from bk import _native
from bk.errors import BKError, DigestMismatchError
from bk.formats.entry import CRC32_DIGEST, CRC32C_DIGEST, ENTRY_HEADER, LAC_HEADER
from bk.proto.constants import DIGEST_LENGTH_BYTES, ENTRY_HEADER_LENGTH, LAC_HEADER_LENGTH, DigestType

_codec = _native.load("codec")
_crc32c = _codec.crc32c
_crc32 = zlib.crc32
_compare = hmac.compare_digest

_entry_header = ENTRY_HEADER
_lac_header = LAC_HEADER
_u64 = CRC32_DIGEST
_u32 = CRC32C_DIGEST

_MAC_PREFIX = b"mac"


class UnknownDigestTypeError(BKError, ValueError):
    """A digest type that is none of CRC32, CRC32C, MAC/HMAC, DUMMY (or 1..4)."""


def parse_digest_type(value) -> DigestType:
    """Accepts a DigestType, its metadata number (1..4) or its name ("CRC32C", "HMAC", ...)."""
    if isinstance(value, DigestType):
        return value
    if isinstance(value, str):
        try:
            return DigestType[value.strip().upper()]
        except KeyError:
            raise UnknownDigestTypeError(f"unknown digest type {value!r}; use CRC32, CRC32C, MAC (HMAC) or DUMMY") from None
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return DigestType(value)
        except ValueError:
            raise UnknownDigestTypeError(f"unknown digest type number {value}; use 1..4") from None
    raise UnknownDigestTypeError(f"unknown digest type {value!r}")


def mac_key(password: bytes) -> bytes:
    """The HMAC key of the MAC digest: SHA-1(b"mac" + password)."""
    if isinstance(password, str):
        raise TypeError("ledger passwords are bytes; encode the string first (BookKeeper uses UTF-8)")
    return hashlib.sha1(_MAC_PREFIX + bytes(password)).digest()


class DigestManager:
    """Frames and verifies entries and explicit LAC buffers of one ledger.

    Stateless apart from the precomputed keyed MAC, so one instance serves
    every add and read of the ledger; safe to share between threads.
    """

    __slots__ = ("ledger_id", "digest_type", "digest_length", "_digest", "_mac", "_check")

    def __init__(self, ledger_id: int, digest_type: DigestType | int | str, password: bytes = b""):
        self.ledger_id = int(ledger_id)
        self.digest_type = parse_digest_type(digest_type)
        self.digest_length = DIGEST_LENGTH_BYTES[self.digest_type]
        self._mac = None
        self._check = None  # a kernel checking a whole entry in one call: CRC32C, the default
        kind = self.digest_type
        if kind is DigestType.CRC32:
            self._digest = self._digest_crc32
        elif kind is DigestType.CRC32C:
            self._digest = self._digest_crc32c
            self._check = _codec.crc32c_entry_ids
        elif kind is DigestType.MAC:
            # Keying HMAC costs two SHA-1 blocks; copying a keyed object does not.
            self._mac = hmac.new(mac_key(password), digestmod=hashlib.sha1)
            self._digest = self._digest_mac
        else:
            self._digest = self._digest_dummy

    def __repr__(self) -> str:  # never shows the password or keys
        return f"DigestManager(ledger_id={self.ledger_id}, digest_type={self.digest_type.name})"

    # -- digest functions: (header bytes, payload bytes-like) -> digest bytes
    @staticmethod
    def _digest_crc32(header: bytes, payload) -> bytes:
        return _u64.pack(_crc32(payload, _crc32(header)))

    @staticmethod
    def _digest_crc32c(header: bytes, payload) -> bytes:
        # The codec kernel takes any buffer (a read's payload is a view of its frame) and runs
        # three interleaved streams (~28 GB/s on 64 KiB, google_crc32c ~16 GB/s on bytes plus
        # a copy for a view); its pure twin is google_crc32c.
        return _u32.pack(_crc32c(payload, _crc32c(header)))

    def _digest_mac(self, header: bytes, payload) -> bytes:
        h = self._mac.copy()
        h.update(header)
        h.update(payload)
        return h.digest()

    @staticmethod
    def _digest_dummy(header: bytes, payload) -> bytes:
        return b""

    def digest(self, header: bytes, payload=b"") -> bytes:
        """The digest of `header` followed by `payload` (for tests and tools)."""
        return self._digest(header, payload)

    # -- entries
    def frame_entry(self, entry_id: int, lac: int, total_length: int, payload) -> bytes:
        """`ledger_id | entry_id | lac | total_length | digest | payload`, ready for an ADD."""
        try:
            header = _entry_header.pack(self.ledger_id, entry_id, lac, total_length)
        except struct.error as e:
            raise ValueError(f"entry header fields must be signed 64-bit integers: {e}") from None
        return b"".join((header, self._digest(header, payload), payload))

    def unpack_entry(self, data) -> tuple[int, int, int, memoryview]:
        """Checks the digest and the ledger id; returns (entry_id, lac, length, payload).

        For reads whose entry id the caller does not know in advance (entry -1).
        """
        if self._check is not None:  # the entry's digest and ids in one kernel call
            ids = self._check(data)
            if ids is not None and ids[0] == self.ledger_id:
                return ids[1], ids[2], ids[3], memoryview(data)[ENTRY_HEADER_LENGTH + self.digest_length:]
            # else the full check below says what is wrong
        n = len(data)
        body_offset = ENTRY_HEADER_LENGTH + self.digest_length
        if n < body_offset:
            raise DigestMismatchError(
                f"ledger {self.ledger_id}: entry of {n} bytes is shorter than its header and "
                f"{self.digest_type.name} digest ({body_offset} bytes)")
        mv = memoryview(data)
        ledger_id, entry_id, lac, length = _entry_header.unpack_from(mv, 0)
        if ledger_id != self.ledger_id:
            raise DigestMismatchError(
                f"entry {entry_id} belongs to ledger {ledger_id}, expected ledger {self.ledger_id}")
        header = bytes(mv[:ENTRY_HEADER_LENGTH])
        payload = mv[body_offset:]
        expected = self._digest(header, payload)
        if not _compare(expected, mv[ENTRY_HEADER_LENGTH:body_offset]):
            raise DigestMismatchError(
                f"ledger {self.ledger_id} entry {entry_id}: {self.digest_type.name} digest mismatch")
        return entry_id, lac, length, payload

    def verify_entry(self, entry_id: int, data) -> tuple[int, int, memoryview]:
        """Checks digest, ledger id and entry id; returns (lac, length, payload)."""
        got_entry_id, lac, length, payload = self.unpack_entry(data)
        if got_entry_id != entry_id:
            raise DigestMismatchError(
                f"ledger {self.ledger_id}: asked for entry {entry_id}, got entry {got_entry_id}")
        return lac, length, payload

    # -- explicit LAC buffers
    def frame_lac(self, lac: int) -> bytes:
        """`ledger_id | lac | digest`, the buffer a WRITE_LAC carries."""
        try:
            header = _lac_header.pack(self.ledger_id, lac)
        except struct.error as e:
            raise ValueError(f"lac must be a signed 64-bit integer: {e}") from None
        return header + self._digest(header, b"")

    def verify_lac(self, buf) -> int:
        """Checks an explicit LAC buffer's digest and ledger id; returns the LAC."""
        n = len(buf)
        want = LAC_HEADER_LENGTH + self.digest_length
        if n != want:
            raise DigestMismatchError(
                f"ledger {self.ledger_id}: LAC buffer of {n} bytes, expected {want} "
                f"({self.digest_type.name})")
        mv = memoryview(buf)
        ledger_id, lac = _lac_header.unpack_from(mv, 0)
        if ledger_id != self.ledger_id:
            raise DigestMismatchError(f"LAC buffer of ledger {ledger_id}, expected ledger {self.ledger_id}")
        header = bytes(mv[:LAC_HEADER_LENGTH])
        if not _compare(self._digest(header, b""), mv[LAC_HEADER_LENGTH:]):
            raise DigestMismatchError(f"ledger {self.ledger_id}: {self.digest_type.name} LAC digest mismatch")
        return lac
