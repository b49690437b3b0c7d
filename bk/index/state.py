"""Encoders and checking decoders of the LMDB index's keys and values, and LedgerState.

Pure module (no lmdb). The layouts themselves are bk/formats/index.py's (one home for every
format); this module adds the checks that turn a bad stored value into CorruptedStorageError:

    locations  key ledger_id i64 | entry_id i64 (big-endian; ids are non-negative,
               so byte order is (ledger, entry) order)   value location u64
    ledgers    key ledger_id i64   value flags u8 (1=exists 2=fenced 4=limbo) | key_len u8 |
               master_key | explicit_lac_len u32 | explicit_lac
    state      b"unclean_shutdown", b"needs_integrity_check" -> b"1";
               b"logmark/<journal index>" -> file_id u64 | offset u64;
               b"compacting/<log id>" -> b"" (a compaction of that entry log started:
               until its live entries are copied, switched and the file deleted, and
               then the key with it, every start of GC finishes it: GC.md)
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from bk.errors import CorruptedStorageError
from bk.formats.index import (COMPACTING_PREFIX, LEDGER_FLAG_EXISTS, LEDGER_FLAG_FENCED, LEDGER_FLAG_LIMBO,
                              LEDGER_FLAGS_KNOWN, LEDGER_KEY, LEDGER_LAC_LENGTH, LEDGER_MAX_KEY_BYTES,
                              LEDGER_RECORD_MIN_BYTES, LOCATION_KEY, LOCATION_VALUE, LOG_MARK_PREFIX, LOG_MARK_VALUE,
                              MAX_ID, STATE_FLAG_TRUE)
from bk.formats.index import STATE_NEEDS_INTEGRITY_CHECK as NEEDS_INTEGRITY_CHECK  # noqa: F401  (bk.index's names)
from bk.formats.index import STATE_UNCLEAN_SHUTDOWN as UNCLEAN_SHUTDOWN  # noqa: F401
from bk.formats.journal import LogMark

_FLAG_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


@dataclass(frozen=True)
class LedgerState:
    """A ledger's record in the `ledgers` database. Empty bytes mean "none"."""

    fenced: bool = False
    limbo: bool = False
    master_key: bytes | None = None
    explicit_lac: bytes | None = None

    def __post_init__(self):
        for name in ("master_key", "explicit_lac"):
            v = getattr(self, name)
            if v is not None:
                v = bytes(v)
                object.__setattr__(self, name, v or None)  # b"" and None encode alike
        if self.master_key is not None and len(self.master_key) > LEDGER_MAX_KEY_BYTES:
            raise ValueError(f"master key of {len(self.master_key)} bytes; at most {LEDGER_MAX_KEY_BYTES} fit "
                             "its u8 length")
        if self.explicit_lac is not None and len(self.explicit_lac) > 0xFFFFFFFF:
            raise ValueError("explicit LAC does not fit its u32 length")

    def encode(self) -> bytes:
        flags = (LEDGER_FLAG_EXISTS | (LEDGER_FLAG_FENCED if self.fenced else 0)
                 | (LEDGER_FLAG_LIMBO if self.limbo else 0))
        key = self.master_key or b""
        lac = self.explicit_lac or b""
        return bytes((flags, len(key))) + key + LEDGER_LAC_LENGTH.pack(len(lac)) + lac

    @classmethod
    def decode(cls, value: bytes, *, path: str | None = None, ledger_id: int | None = None) -> "LedgerState":
        """Strict: any length mismatch or unknown flag is CorruptedStorageError."""
        def bad(why: str):
            return CorruptedStorageError(f"index ledger record of ledger {ledger_id}: {why}",
                                         path=path, ledger_id=ledger_id)

        value = bytes(value)
        if len(value) < LEDGER_RECORD_MIN_BYTES:
            raise bad(f"{len(value)} bytes, at least {LEDGER_RECORD_MIN_BYTES} expected")
        flags, key_len = value[0], value[1]
        if flags & ~LEDGER_FLAGS_KNOWN or not flags & LEDGER_FLAG_EXISTS:
            raise bad(f"bad flags {flags:#x}")
        pos = 2 + key_len
        lac_at = pos + LEDGER_LAC_LENGTH.size
        if len(value) < lac_at:
            raise bad(f"master key of {key_len} bytes runs past the value")
        (lac_len,) = LEDGER_LAC_LENGTH.unpack_from(value, pos)
        if len(value) != lac_at + lac_len:
            raise bad(f"explicit LAC length {lac_len} does not match the value ({len(value)} bytes)")
        return cls(fenced=bool(flags & LEDGER_FLAG_FENCED), limbo=bool(flags & LEDGER_FLAG_LIMBO),
                   master_key=value[2:pos] or None, explicit_lac=value[lac_at:] or None)


def check_id(what: str, value: int) -> int:
    if not isinstance(value, int) or not 0 <= value <= MAX_ID:
        raise ValueError(f"{what} must be an integer in 0..2**63-1, got {value!r}")
    return value


def location_key(ledger_id: int, entry_id: int) -> bytes:
    return LOCATION_KEY.pack(check_id("ledger id", ledger_id), check_id("entry id", entry_id))


def split_location_key(key: bytes, path: str | None = None) -> tuple[int, int]:
    """(ledger_id, entry_id) of a stored location key; CorruptedStorageError unless it is 16 bytes
    of two ids in 0..2**63-1 (what location_key writes)."""
    if len(key) != LOCATION_KEY.size:
        raise CorruptedStorageError(f"index location key of {len(key)} bytes, expected {LOCATION_KEY.size}",
                                    path=path)
    ledger_id, entry_id = LOCATION_KEY.unpack(key)
    if ledger_id > MAX_ID or entry_id > MAX_ID:
        raise CorruptedStorageError(f"index location key {bytes(key).hex()} holds an id above 2**63-1", path=path)
    return ledger_id, entry_id


def split_ledger_key(key: bytes, path: str | None = None) -> int:
    """The ledger id of a stored ledger key; CorruptedStorageError unless 8 bytes of an id in 0..2**63-1."""
    if len(key) != LEDGER_KEY.size:
        raise CorruptedStorageError(f"index ledger key of {len(key)} bytes", path=path)
    (ledger_id,) = LEDGER_KEY.unpack(key)
    if ledger_id > MAX_ID:
        raise CorruptedStorageError(f"index ledger key {bytes(key).hex()} holds an id above 2**63-1", path=path)
    return ledger_id


def decode_location(value: bytes, path: str | None = None) -> int:
    """The location of a stored location value; CorruptedStorageError unless 8 bytes."""
    if len(value) != LOCATION_VALUE.size:
        raise CorruptedStorageError(f"index location value of {len(value)} bytes, expected {LOCATION_VALUE.size}",
                                    path=path)
    return LOCATION_VALUE.unpack(value)[0]


def ledger_key(ledger_id: int) -> bytes:
    return LEDGER_KEY.pack(check_id("ledger id", ledger_id))


def flag_key(name: str) -> bytes:
    if not isinstance(name, str) or not _FLAG_NAME.match(name):
        raise ValueError(f"bad flag name {name!r} (lower-case letters, digits and _)")
    return name.encode()


def decode_flag(name: str, value: bytes | None, path: str | None = None) -> bool:
    if value is None:
        return False
    if bytes(value) != STATE_FLAG_TRUE:
        raise CorruptedStorageError(f"index flag {name!r} has value {bytes(value)!r}, expected b'1'", path=path)
    return True


def log_mark_key(journal_index: int) -> bytes:
    if not isinstance(journal_index, int) or journal_index < 0:
        raise ValueError(f"journal index must be a non-negative integer, got {journal_index!r}")
    return LOG_MARK_PREFIX + b"%d" % journal_index


def encode_log_mark(mark: LogMark) -> bytes:
    try:
        return LOG_MARK_VALUE.pack(mark.file_id, mark.offset)
    except struct.error:
        raise ValueError(f"log mark {mark!r} does not fit u64 file id and offset") from None


def decode_log_mark(value: bytes, path: str | None = None) -> LogMark:
    if len(value) != LOG_MARK_VALUE.size:
        raise CorruptedStorageError(f"index log mark is {len(value)} bytes, expected {LOG_MARK_VALUE.size}", path=path)
    return LogMark(*LOG_MARK_VALUE.unpack(value))


def compacting_log_key(log_id: int) -> bytes:
    if not isinstance(log_id, int) or log_id < 0:
        raise ValueError(f"log id must be a non-negative integer, got {log_id!r}")
    return COMPACTING_PREFIX + b"%d" % log_id


def parse_compacting_log_key(key: bytes) -> int | None:
    if not key.startswith(COMPACTING_PREFIX) or not key[len(COMPACTING_PREFIX):].isdigit():
        return None
    return int(key[len(COMPACTING_PREFIX):])
