"""Quorum arithmetic shared by the writer, the readers and ledger recovery (REPLICATION.md).

- Write set of entry e in an ensemble of E bookies with write quorum WQ: the
  ensemble indexes `(e + i) mod E` for `i = 0..WQ-1` (round robin).
- An entry is acknowledged once AQ bookies of its write set answered EOK.
- Quorum coverage of a cohort of n members: covered once `n - AQ + 1` members
  have a property, i.e. every possible ack quorum inside the cohort contains
  one of them (fencing covers the ensemble, n = E; a negative read covers the
  write set, n = WQ).

`AddFramer` builds the complete ADD request frame of an entry once; the same
bytes go to every bookie of its write set and are resent unchanged after an
ensemble change (the frame names no bookie).
"""
from __future__ import annotations


from bk import _native
from bk.errors import IncorrectParameterError
from bk.proto import DigestManager, DigestType
from bk.formats import wire as layout
from bk.formats.wire import ADD_REQUEST_MIN_BYTES, MASTER_KEY_LENGTH, OP_ADD_ENTRY, PROTOCOL_VERSION, pack_header

_entry_header = layout.ENTRY_HEADER
_frame_head = layout.FRAME_HEAD
# header(4) + master key(20) + entry header(32), then digest(N) + payload
_ADD_FIXED_BYTES = ADD_REQUEST_MIN_BYTES
_frame_add_crc32c = _native.load("codec").frame_add_crc32c
# Above this payload size google_crc32c's 3-way CRC beats the kernel's single
# stream by more than the extra copy of the join costs (measured ~8 KiB).
_KERNEL_FRAME_MAX_PAYLOAD = 8192


def check_quorum_sizes(ensemble_size: int, write_quorum_size: int, ack_quorum_size: int) -> None:
    for name, value in (("ensemble_size", ensemble_size), ("write_quorum_size", write_quorum_size),
                        ("ack_quorum_size", ack_quorum_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise IncorrectParameterError(f"{name} must be an int, got {value!r}")
    if not ensemble_size >= write_quorum_size >= ack_quorum_size >= 1:
        raise IncorrectParameterError(
            f"need ensemble_size ({ensemble_size}) >= write_quorum_size ({write_quorum_size})"
            f" >= ack_quorum_size ({ack_quorum_size}) >= 1")


def write_set(entry_id: int, ensemble_size: int, write_quorum_size: int) -> tuple[int, ...]:
    """Ensemble indexes that store `entry_id`, in preference order."""
    return tuple((entry_id + i) % ensemble_size for i in range(write_quorum_size))


def in_write_set(index: int, entry_id: int, ensemble_size: int, write_quorum_size: int) -> bool:
    return (index - entry_id) % ensemble_size < write_quorum_size


def coverage(cohort_size: int, ack_quorum_size: int) -> int:
    """How many members must have a property before no ack quorum lacks it."""
    return cohort_size - ack_quorum_size + 1


class AddFramer:
    """Frames entries of one ledger into ADD request frames (PROTOCOL.md layouts)."""

    __slots__ = ("ledger_id", "master_key", "digest", "digest_length", "max_frame_size_bytes", "_header", "_crc32c")

    def __init__(self, digest_manager: DigestManager, master_key: bytes, max_frame_size_bytes: int, flags: int = 0):
        if len(master_key) != MASTER_KEY_LENGTH:
            raise IncorrectParameterError(f"master key must be {MASTER_KEY_LENGTH} bytes")
        self.ledger_id = digest_manager.ledger_id
        self.master_key = master_key
        self.digest = digest_manager.digest
        self.digest_length = digest_manager.digest_length
        self.max_frame_size_bytes = max_frame_size_bytes
        self._header = pack_header(PROTOCOL_VERSION, OP_ADD_ENTRY, flags)
        self._crc32c = digest_manager.digest_type is DigestType.CRC32C

    def max_payload_bytes(self) -> int:
        return self.max_frame_size_bytes - _ADD_FIXED_BYTES - self.digest_length

    def frame(self, entry_id: int, lac: int, total_length: int, payload: bytes) -> bytes:
        """`len | header | master_key | ledger entry lac length | digest | payload`."""
        if self._crc32c and len(payload) <= _KERNEL_FRAME_MAX_PAYLOAD:  # the common case, one allocation
            return _frame_add_crc32c(self._header, self.master_key, self.ledger_id, entry_id, lac, total_length,
                                     payload)
        header = _entry_header.pack(self.ledger_id, entry_id, lac, total_length)
        digest = self.digest(header, payload)
        body_bytes = _ADD_FIXED_BYTES + len(digest) + len(payload)
        return b"".join((_frame_head.pack(body_bytes, self._header), self.master_key, header, digest, payload))

    def small_frame_kernel(self) -> tuple:
        """`(kernel, header, max_payload)`: `kernel(header, master_key, ledger_id, entry_id, lac,
        total_length, payload)` builds the same frame as `frame` for payloads up to `max_payload`
        bytes; the kernel is None unless the digest is CRC32C (then only `frame` knows how)."""
        return (_frame_add_crc32c if self._crc32c else None), self._header, _KERNEL_FRAME_MAX_PAYLOAD

    def frame_with_flags(self, flags: int, entry_id: int, lac: int, total_length: int, payload: bytes) -> bytes:
        """Like `frame` but with other header flags (FLAG_RECOVERY_ADD for recovery writes)."""
        frame = self.frame(entry_id, lac, total_length, payload)
        head = _frame_head.unpack_from(frame)[0], pack_header(PROTOCOL_VERSION, OP_ADD_ENTRY, flags)
        return _frame_head.pack(*head) + frame[_frame_head.size:]
