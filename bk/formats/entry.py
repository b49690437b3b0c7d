"""The digest-framed entry and the explicit-LAC buffer (PROTOCOL.md), and the master key's length.

Every entry a client writes is framed the same way, and bookies store those bytes untouched
(in the journal, the write cache and the entry logs), so this layout is shared by the wire,
both disk formats, spark/ and fuzz/:

    ledger_id i64 | entry_id i64 | last_add_confirmed i64 | length i64 | digest (N bytes) | payload

The digest covers the 32-byte header followed by the payload. N by digest type (the ledger
metadata's numbers, METADATA.md: CRC32=1, MAC=2, CRC32C=3, DUMMY=4):
    CRC32   8  zlib CRC32 as an unsigned 64-bit big-endian integer
    MAC    20  HMAC-SHA1 keyed with SHA-1(b"mac" + password)
    CRC32C  4  big-endian
    DUMMY   0
Explicit LAC buffer: ledger_id i64 | lac i64 | digest (N), the digest over those 16 bytes.

The pure CRC framing below (`crc32c_entry`, `entry_crc_matches`) is what spark/ writes and
checks entries with; the client's DigestManager (bk/proto/digest.py) computes the same bytes
with the native CRC kernel.
"""
from __future__ import annotations

import struct
import zlib
from enum import IntEnum


# ---------------------------------------------------------------- ids every entry starts with
ENTRY_IDS = struct.Struct(">qq")  # ledger_id entry_id: the first 16 bytes of every stored entry
ENTRY_IDS_BYTES = 16  # the shortest record body a journal or an entry log accepts

# ---------------------------------------------------------------- the entry header
ENTRY_HEADER = struct.Struct(">qqqq")  # ledger_id entry_id last_add_confirmed length
ENTRY_HEADER_LENGTH = 32
ENTRY_LAC_OFFSET = 16  # the piggybacked LAC inside the entry header
ENTRY_IDS_LAC = struct.Struct(">qqq")  # the first 24 bytes of the entry header

# ---------------------------------------------------------------- the explicit LAC buffer
LAC_HEADER = struct.Struct(">qq")  # ledger_id lac
LAC_HEADER_LENGTH = 16

# ---------------------------------------------------------------- digests
class DigestType(IntEnum):
    """Values are the ledger metadata enum (METADATA.md: CRC32=1, HMAC=2, CRC32C=3, DUMMY=4)."""

    CRC32 = 1
    MAC = 2
    HMAC = 2  # METADATA.md's spelling of MAC
    CRC32C = 3
    DUMMY = 4


DIGEST_TYPE_CRC32 = DigestType.CRC32
DIGEST_TYPE_MAC = DigestType.MAC
DIGEST_TYPE_CRC32C = DigestType.CRC32C
DIGEST_TYPE_DUMMY = DigestType.DUMMY
CRC32_DIGEST_LENGTH = 8  # the CRC32 value as a 64-bit integer
MAC_DIGEST_LENGTH = 20  # HMAC-SHA1
CRC32C_DIGEST_LENGTH = 4
DUMMY_DIGEST_LENGTH = 0
DIGEST_LENGTH_BY_TYPE = {DIGEST_TYPE_CRC32: CRC32_DIGEST_LENGTH, DIGEST_TYPE_MAC: MAC_DIGEST_LENGTH,
                         DIGEST_TYPE_CRC32C: CRC32C_DIGEST_LENGTH, DIGEST_TYPE_DUMMY: DUMMY_DIGEST_LENGTH}
CRC32_DIGEST = struct.Struct(">Q")
CRC32C_DIGEST = struct.Struct(">I")

# ---------------------------------------------------------------- the master key
# SHA-1(b"ledger" + password): carried by every ADD, fencing READ and WRITE_LAC, stored per ledger.
MASTER_KEY_LENGTH = 20


def crc32c_entry(ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes) -> bytes:
    """A CRC32C-framed entry, byte for byte what DigestManager(CRC32C).frame_entry writes."""
    import google_crc32c  # here, not at the top: setup.py loads bk/formats in a build env without it
    header = ENTRY_HEADER.pack(ledger_id, entry_id, lac, length)
    return header + CRC32C_DIGEST.pack(google_crc32c.extend(google_crc32c.value(header), bytes(payload))) + payload


def entry_crc_matches(entry, digest_type: int) -> bool | None:
    """Whether a CRC32C or CRC32 entry's digest matches its header and payload; None when the
    entry is shorter than its header and digest or the type is not a CRC (MAC needs the password)."""
    import google_crc32c  # see crc32c_entry
    if digest_type == DIGEST_TYPE_CRC32C:
        start = ENTRY_HEADER_LENGTH + CRC32C_DIGEST_LENGTH
        if len(entry) < start:
            return None
        header = bytes(entry[:ENTRY_HEADER_LENGTH])
        return google_crc32c.extend(google_crc32c.value(header), bytes(entry[start:])) == \
            CRC32C_DIGEST.unpack_from(entry, ENTRY_HEADER_LENGTH)[0]
    if digest_type == DIGEST_TYPE_CRC32:
        start = ENTRY_HEADER_LENGTH + CRC32_DIGEST_LENGTH
        if len(entry) < start:
            return None
        header = bytes(entry[:ENTRY_HEADER_LENGTH])
        return zlib.crc32(entry[start:], zlib.crc32(header)) == CRC32_DIGEST.unpack_from(entry, ENTRY_HEADER_LENGTH)[0]
    return None
