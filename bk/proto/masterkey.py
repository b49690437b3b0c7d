"""Ledger master key: SHA-1(b"ledger" + password), 20 bytes (PROTOCOL.md).

The bookie stores the first key it sees for a ledger and answers EUA to any later
add, fence or WRITE_LAC carrying another one. Keys are secrets: compare them in
constant time and never log them.
"""
from __future__ import annotations

import hashlib
import hmac

_LEDGER_PREFIX = b"ledger"


def _password_bytes(password) -> bytes:
    if isinstance(password, str):
        raise TypeError("ledger passwords are bytes; encode the string first (BookKeeper uses UTF-8)")
    return bytes(password)


def master_key(password: bytes) -> bytes:
    """The 20-byte master key of a ledger with this password (empty password allowed)."""
    return hashlib.sha1(_LEDGER_PREFIX + _password_bytes(password)).digest()


def keys_equal(a: bytes, b: bytes) -> bool:
    """Constant-time comparison of two master keys (timing does not leak the key)."""
    return hmac.compare_digest(a, b)

