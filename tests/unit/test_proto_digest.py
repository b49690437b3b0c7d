"""Entry digests, explicit LAC buffers and master keys (bk.proto.digest, bk.proto.masterkey)."""
import hashlib
import hmac
import struct
import zlib

import google_crc32c
import pytest

from bk.errors import BKError, DigestMismatchError
from bk.proto.digest import (
    DIGEST_LENGTH_BYTES, DigestManager, DigestType, UnknownDigestTypeError, mac_key, parse_digest_type,
)
from bk.proto.masterkey import keys_equal, master_key

ALL_TYPES = [DigestType.CRC32, DigestType.CRC32C, DigestType.MAC, DigestType.DUMMY]
CHECKED_TYPES = [DigestType.CRC32, DigestType.CRC32C, DigestType.MAC]


# ---------------------------------------------------------------- master key
def test_master_key_is_sha1_of_ledger_and_password():
    assert master_key(b"secret") == hashlib.sha1(b"ledgersecret").digest()
    assert master_key(b"secret").hex() == "e793cbc379107648537183605cd361d3bb789a39"
    # SHA-1("ledger"): the key of every ledger created with an empty password.
    assert master_key(b"").hex() == "850bf1071c5e3d8c24235676f8816ae0cbe2f14f"
    assert len(master_key(b"x" * 1000)) == 20
    assert master_key(bytearray(b"pw")) == master_key(b"pw")


def test_master_key_refuses_text():
    with pytest.raises(TypeError):
        master_key("pw")


def test_keys_equal():
    a = master_key(b"a")
    assert keys_equal(a, master_key(b"a"))
    assert keys_equal(a, memoryview(bytes(a)))
    assert not keys_equal(a, master_key(b"b"))
    assert not keys_equal(a, a[:19])


# ---------------------------------------------------------------- digest types
@pytest.mark.parametrize("value,expected", [
    ("CRC32", DigestType.CRC32), ("crc32c", DigestType.CRC32C), ("MAC", DigestType.MAC),
    ("HMAC", DigestType.MAC), (" dummy ", DigestType.DUMMY), (1, DigestType.CRC32), (2, DigestType.MAC),
    (3, DigestType.CRC32C), (4, DigestType.DUMMY), (DigestType.HMAC, DigestType.MAC),
])
def test_parse_digest_type(value, expected):
    assert parse_digest_type(value) is expected


@pytest.mark.parametrize("value", ["SHA256", "", 0, 5, True, 1.0, None])
def test_parse_digest_type_rejects(value):
    with pytest.raises(UnknownDigestTypeError) as info:
        parse_digest_type(value)
    assert isinstance(info.value, BKError) and isinstance(info.value, ValueError)


def test_digest_lengths_and_metadata_numbers():
    assert {t.name: DIGEST_LENGTH_BYTES[t] for t in ALL_TYPES} == {"CRC32": 8, "CRC32C": 4, "MAC": 20, "DUMMY": 0}
    assert [int(t) for t in ALL_TYPES] == [1, 3, 2, 4]


# ---------------------------------------------------------------- entry layout
def test_entry_layout_crc32():
    d = DigestManager(11, "CRC32")
    e = d.frame_entry(4, 3, 1000, b"payload")
    head = struct.pack(">qqqq", 11, 4, 3, 1000)
    assert e == head + struct.pack(">Q", zlib.crc32(head + b"payload")) + b"payload"


def test_entry_layout_crc32c():
    d = DigestManager(11, DigestType.CRC32C)
    e = d.frame_entry(4, 3, 1000, b"payload")
    head = struct.pack(">qqqq", 11, 4, 3, 1000)
    assert e == head + struct.pack(">I", google_crc32c.value(head + b"payload")) + b"payload"


def test_entry_layout_mac():
    d = DigestManager(11, 2, b"pw")
    e = d.frame_entry(4, -1, 7, b"payload")
    head = struct.pack(">qqqq", 11, 4, -1, 7)
    key = hashlib.sha1(b"macpw").digest()
    assert mac_key(b"pw") == key
    assert e == head + hmac.new(key, head + b"payload", hashlib.sha1).digest() + b"payload"


def test_entry_layout_dummy():
    d = DigestManager(11, "DUMMY")
    assert d.frame_entry(0, -1, 0, b"") == struct.pack(">qqqq", 11, 0, -1, 0)


@pytest.mark.parametrize("kind", ALL_TYPES)
@pytest.mark.parametrize("payload", [b"", b"x", bytes(range(256)) * 4, b"\x00" * 65536])
def test_entry_round_trip(kind, payload):
    d = DigestManager(1 << 40, kind, b"password")
    e = d.frame_entry(17, 16, 1 << 33, payload)
    assert len(e) == 32 + DIGEST_LENGTH_BYTES[kind] + len(payload)
    lac, length, body = d.verify_entry(17, e)
    assert (lac, length, bytes(body)) == (16, 1 << 33, payload)
    assert isinstance(body, memoryview)
    assert d.unpack_entry(bytearray(e))[0] == 17
    # payload given as a memoryview frames the same bytes
    assert d.frame_entry(17, 16, 1 << 33, memoryview(payload)) == e


@pytest.mark.parametrize("kind", CHECKED_TYPES)
def test_every_flipped_byte_is_detected(kind):
    d = DigestManager(9, kind, b"pw")
    e = bytearray(d.frame_entry(3, 2, 10, b"0123456789"))
    for i in range(len(e)):
        bad = bytearray(e)
        bad[i] ^= 0x40
        with pytest.raises(DigestMismatchError):
            d.verify_entry(3, bytes(bad))


@pytest.mark.parametrize("kind", ALL_TYPES)
def test_wrong_ids_are_mismatches(kind):
    d = DigestManager(9, kind, b"pw")
    e = d.frame_entry(3, 2, 10, b"abc")
    with pytest.raises(DigestMismatchError, match="asked for entry 4"):
        d.verify_entry(4, e)
    with pytest.raises(DigestMismatchError, match="ledger 9"):
        DigestManager(10, kind, b"pw").verify_entry(3, e)
    with pytest.raises(DigestMismatchError, match="shorter"):
        d.verify_entry(3, e[:31 + DIGEST_LENGTH_BYTES[kind]])


def test_dummy_detects_only_ids():
    d = DigestManager(9, "DUMMY")
    e = bytearray(d.frame_entry(3, 2, 10, b"abc"))
    e[-1] ^= 1  # no digest: payload damage passes, as in BookKeeper
    assert bytes(d.verify_entry(3, bytes(e))[2]) == b"abb"


def test_mac_with_wrong_password_is_a_mismatch():
    e = DigestManager(9, "MAC", b"right").frame_entry(0, -1, 3, b"abc")
    with pytest.raises(DigestMismatchError, match="MAC digest mismatch"):
        DigestManager(9, "MAC", b"wrong").verify_entry(0, e)
    # CRC digests do not depend on the password
    e = DigestManager(9, "CRC32C", b"right").frame_entry(0, -1, 3, b"abc")
    DigestManager(9, "CRC32C", b"wrong").verify_entry(0, e)


def test_mismatch_between_digest_types():
    e = DigestManager(9, "CRC32").frame_entry(0, -1, 3, b"abcdefgh")
    with pytest.raises(DigestMismatchError):
        DigestManager(9, "CRC32C").verify_entry(0, e)


def test_frame_entry_rejects_out_of_range_ids():
    d = DigestManager(9, "CRC32C")
    with pytest.raises(ValueError):
        d.frame_entry(1 << 63, 0, 0, b"")


def test_repr_hides_secrets():
    r = repr(DigestManager(9, "MAC", b"hunter2"))
    assert "hunter2" not in r and "MAC" in r


# ---------------------------------------------------------------- explicit LAC buffer
@pytest.mark.parametrize("kind", ALL_TYPES)
def test_lac_round_trip(kind):
    d = DigestManager(77, kind, b"pw")
    buf = d.frame_lac(41)
    assert len(buf) == 16 + DIGEST_LENGTH_BYTES[kind]
    assert buf[:16] == struct.pack(">qq", 77, 41)
    assert d.verify_lac(buf) == 41
    assert d.verify_lac(memoryview(buf)) == 41
    assert d.verify_lac(d.frame_lac(-1)) == -1


def test_lac_digest_covers_the_16_bytes():
    d = DigestManager(77, "CRC32C")
    buf = d.frame_lac(41)
    assert buf[16:] == struct.pack(">I", google_crc32c.value(struct.pack(">qq", 77, 41)))


@pytest.mark.parametrize("kind", CHECKED_TYPES)
def test_lac_tampering_is_detected(kind):
    d = DigestManager(77, kind, b"pw")
    buf = d.frame_lac(41)
    for i in range(len(buf)):
        bad = bytearray(buf)
        bad[i] ^= 1
        with pytest.raises(DigestMismatchError):
            d.verify_lac(bytes(bad))
    with pytest.raises(DigestMismatchError):
        d.verify_lac(buf + b"x")
    with pytest.raises(DigestMismatchError):
        DigestManager(78, kind, b"pw").verify_lac(buf)
