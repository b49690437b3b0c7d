"""LedgerMetadata: the immutable value stored in a ledger znode, and its codec.

A ledger's metadata is a value: every change builds a new object (the `with_*`
methods) and is written with a compare-and-set on the znode version, so code
holding an older object never sees it change under its feet.

Invariants checked on construction (and so on every decode):
- ensemble_size >= write_quorum_size >= ack_quorum_size >= 1;
- segments (BookKeeper's ensembles) are `(first_entry_id, bookies)` with the
  first at entry 0, first ids strictly increasing, each with `ensemble_size`
  distinct bookie ids;
- last_entry_id >= -1, length >= 0.

Wire format (METADATA.md): `BookieMetadataFormatVersion\\t3\\n`, a varint32
length, then the binary `LedgerMetadataFormat`. Version 2 (the same message in
protobuf text format after the header) is read too, never written.
"""
from __future__ import annotations

import base64
import bisect
import dataclasses
import enum
import secrets
import time
from dataclasses import dataclass
from typing import Iterable, Mapping

from bk.errors import LedgerClosedError, MetadataFormatError
from bk.meta import formats

HEADER_PREFIX = b"BookieMetadataFormatVersion\t"
FORMAT_VERSION = 3
HEADER = HEADER_PREFIX + b"3\n"


class LedgerState(enum.IntEnum):
    OPEN = 1
    IN_RECOVERY = 2
    CLOSED = 3


class DigestType(enum.IntEnum):
    CRC32 = 1
    HMAC = 2
    CRC32C = 3
    DUMMY = 4


Segment = tuple[int, tuple[str, ...]]


def _ensemble(bookies: Iterable[str]) -> tuple[str, ...]:
    if isinstance(bookies, str):
        raise MetadataFormatError(f"an ensemble is a list of bookie ids, not the string {bookies!r}")
    return tuple(bookies)


@dataclass(frozen=True)
class LedgerMetadata:
    ensemble_size: int
    write_quorum_size: int
    ack_quorum_size: int
    segments: tuple[Segment, ...]
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1
    length: int = 0
    digest_type: DigestType | None = DigestType.CRC32C
    password: bytes | None = b""
    ctime: int | None = None  # ms since the epoch
    custom_metadata: tuple[tuple[str, bytes], ...] = ()  # sorted by key; a dict is accepted
    ctoken: int | None = None

    def __post_init__(self) -> None:
        try:
            segments = tuple((int(first), _ensemble(bookies)) for first, bookies in self.segments)
        except (TypeError, ValueError) as e:
            raise MetadataFormatError(f"invalid ledger metadata: bad segments {self.segments!r}: {e}") from None
        custom = self.custom_metadata
        if isinstance(custom, Mapping):
            custom = custom.items()
        custom = tuple(sorted((str(k), bytes(v)) for k, v in custom))
        object.__setattr__(self, "segments", segments)
        object.__setattr__(self, "custom_metadata", custom)
        try:
            object.__setattr__(self, "state", LedgerState(self.state))
            if self.digest_type is not None:
                object.__setattr__(self, "digest_type", DigestType(self.digest_type))
        except ValueError as e:
            raise MetadataFormatError(f"invalid ledger metadata: {e}") from None
        if self.password is not None:
            object.__setattr__(self, "password", bytes(self.password))
        self._validate()

    def _validate(self) -> None:
        def bad(why: str) -> MetadataFormatError:
            return MetadataFormatError(f"invalid ledger metadata: {why}")

        if not self.ensemble_size >= self.write_quorum_size >= self.ack_quorum_size >= 1:
            raise bad(
                f"need ensemble {self.ensemble_size} >= write quorum {self.write_quorum_size}"
                f" >= ack quorum {self.ack_quorum_size} >= 1"
            )
        if not self.segments:
            raise bad("no segments (ensembles)")
        if self.segments[0][0] != 0:
            raise bad(f"first segment starts at entry {self.segments[0][0]}, not 0")
        previous = -1
        for first, bookies in self.segments:
            if first <= previous:
                raise bad(f"segment first entry ids not strictly increasing ({previous} then {first})")
            previous = first
            if len(bookies) != self.ensemble_size:
                raise bad(f"segment at {first} has {len(bookies)} bookies, ensemble size is {self.ensemble_size}")
            if len(set(bookies)) != len(bookies) or not all(isinstance(b, str) and b for b in bookies):
                raise bad(f"segment at {first} has repeated or empty bookie ids: {list(bookies)}")
        if self.last_entry_id < -1:
            raise bad(f"last entry id {self.last_entry_id} < -1")
        if self.length < 0:
            raise bad(f"length {self.length} < 0")

    # ------------------------------------------------------------------ building
    @classmethod
    def new(
        cls,
        ensemble: Iterable[str],
        write_quorum_size: int,
        ack_quorum_size: int,
        *,
        digest_type: DigestType = DigestType.CRC32C,
        password: bytes = b"",
        custom_metadata: Mapping[str, bytes] | None = None,
        ctime_ms: int | None = None,
    ) -> "LedgerMetadata":
        """A new OPEN ledger with one segment at entry 0, a creation time and token."""
        ensemble = _ensemble(ensemble)
        return cls(
            ensemble_size=len(ensemble),
            write_quorum_size=write_quorum_size,
            ack_quorum_size=ack_quorum_size,
            segments=((0, ensemble),),
            digest_type=digest_type,
            password=password,
            ctime=int(time.time() * 1000) if ctime_ms is None else ctime_ms,
            custom_metadata=custom_metadata or (),
            ctoken=secrets.randbits(63),
        )

    def replace(self, **changes) -> "LedgerMetadata":
        return dataclasses.replace(self, **changes)

    def with_in_recovery(self) -> "LedgerMetadata":
        if self.state is LedgerState.CLOSED:
            raise LedgerClosedError(f"ledger is already closed at entry {self.last_entry_id}")
        return self.replace(state=LedgerState.IN_RECOVERY)

    def with_closed(self, last_entry_id: int, length: int) -> "LedgerMetadata":
        """CLOSED with these final values; closing again with the same values is a no-op,
        with different values a LedgerClosedError (a closed ledger never changes its end)."""
        if self.state is LedgerState.CLOSED:
            if (self.last_entry_id, self.length) == (last_entry_id, length):
                return self
            raise LedgerClosedError(
                f"ledger is already closed at entry {self.last_entry_id} (length {self.length}),"
                f" cannot close at {last_entry_id} (length {length})"
            )
        return self.replace(state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length)

    def with_ensemble_change(self, first_entry_id: int, ensemble: Iterable[str]) -> "LedgerMetadata":
        """A writer's ensemble change: a new last segment from `first_entry_id` on (it
        replaces the last segment when that one starts at the same entry, i.e. is empty)."""
        if self.state is LedgerState.CLOSED:
            raise LedgerClosedError(f"ledger is closed at entry {self.last_entry_id}: no ensemble change")
        last_first = self.segments[-1][0]
        if first_entry_id < last_first:
            raise MetadataFormatError(
                f"invalid ensemble change at entry {first_entry_id}: last segment starts at {last_first}"
            )
        keep = self.segments[:-1] if first_entry_id == last_first else self.segments
        return self.replace(segments=keep + ((first_entry_id, _ensemble(ensemble)),))

    def with_segment_replaced(self, first_entry_id: int, ensemble: Iterable[str]) -> "LedgerMetadata":
        """Re-replication: the segment starting at `first_entry_id` gets new bookies
        (allowed on closed ledgers; entry ids never change)."""
        firsts = [first for first, _ in self.segments]
        if first_entry_id not in firsts:
            raise MetadataFormatError(f"no segment starts at entry {first_entry_id} (segments start at {firsts})")
        i = firsts.index(first_entry_id)
        segments = self.segments[:i] + ((first_entry_id, _ensemble(ensemble)),) + self.segments[i + 1 :]
        return self.replace(segments=segments)

    def with_custom_metadata(self, custom: Mapping[str, bytes]) -> "LedgerMetadata":
        return self.replace(custom_metadata=custom)

    # ------------------------------------------------------------------ queries
    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    @property
    def last_segment(self) -> Segment:
        return self.segments[-1]

    @property
    def ensembles(self) -> dict[int, tuple[str, ...]]:
        return dict(self.segments)

    @property
    def custom(self) -> dict[str, bytes]:
        return dict(self.custom_metadata)

    def segment_index_for(self, entry_id: int) -> int:
        if entry_id < 0:
            raise MetadataFormatError(f"no ensemble for negative entry id {entry_id}")
        firsts = [first for first, _ in self.segments]
        return bisect.bisect_right(firsts, entry_id) - 1

    def ensemble_for(self, entry_id: int) -> tuple[str, ...]:
        """The bookies of the segment that holds `entry_id`."""
        return self.segments[self.segment_index_for(entry_id)][1]

    def segment_end(self, index: int) -> int:
        """Last entry id of segment `index`: next segment's first - 1, or for the last
        segment the ledger's last_entry_id if closed, else -1 meaning open-ended."""
        if index + 1 < len(self.segments):
            return self.segments[index + 1][0] - 1
        return self.last_entry_id if self.is_closed else -1

    def bookies(self) -> set[str]:
        return {b for _, bookies in self.segments for b in bookies}

    # ------------------------------------------------------------------ codec
    def serialize(self) -> bytes:
        msg = formats.LedgerMetadataFormat(
            quorumSize=self.write_quorum_size,
            ensembleSize=self.ensemble_size,
            length=self.length,
            lastEntryId=self.last_entry_id,
            state=int(self.state),
            ackQuorumSize=self.ack_quorum_size,
        )
        for first, bookies in self.segments:
            segment = msg.segment.add()
            segment.ensembleMember.extend(bookies)
            segment.firstEntryId = first
        if self.digest_type is not None:
            msg.digestType = int(self.digest_type)
        if self.password is not None:
            msg.password = self.password
        if self.ctime is not None:
            msg.ctime = self.ctime
        for key, value in self.custom_metadata:
            msg.customMetadata.add(key=key, value=value)
        if self.ctoken is not None:
            msg.cToken = self.ctoken
        body = formats.to_binary(msg)
        return HEADER + formats.encode_varint32(len(body)) + body

    @classmethod
    def deserialize(cls, data: bytes) -> "LedgerMetadata":
        data = bytes(data)
        newline = data.find(b"\n")
        if not data.startswith(HEADER_PREFIX) or newline < 0:
            raise MetadataFormatError(f"not ledger metadata: header {data[:40]!r}")
        try:
            version = int(data[len(HEADER_PREFIX) : newline])
        except ValueError:
            raise MetadataFormatError(f"bad ledger metadata header {data[: newline + 1]!r}") from None
        if version == 3:
            size, start = formats.decode_varint32(data, newline + 1)
            end = start + size
            if end != len(data):
                raise MetadataFormatError(
                    f"ledger metadata body is {len(data) - start} bytes, its length prefix says {size}"
                )
            msg = formats.from_binary(formats.LedgerMetadataFormat, data[start:end])
        elif version == 2:
            msg = formats.from_text(formats.LedgerMetadataFormat, data[newline + 1 :])
        else:
            raise MetadataFormatError(f"unsupported ledger metadata format version {version} (read 2 and 3)")
        return cls._from_message(msg)

    @classmethod
    def _from_message(cls, msg) -> "LedgerMetadata":
        return cls(
            ensemble_size=msg.ensembleSize,
            write_quorum_size=msg.quorumSize,
            ack_quorum_size=msg.ackQuorumSize if msg.HasField("ackQuorumSize") else msg.quorumSize,
            segments=tuple((s.firstEntryId, tuple(s.ensembleMember)) for s in msg.segment),
            state=msg.state,
            last_entry_id=msg.lastEntryId if msg.HasField("lastEntryId") else -1,
            length=msg.length,
            digest_type=msg.digestType if msg.HasField("digestType") else None,
            password=msg.password if msg.HasField("password") else None,
            ctime=msg.ctime if msg.HasField("ctime") else None,
            custom_metadata=tuple((e.key, e.value) for e in msg.customMetadata),
            ctoken=msg.cToken if msg.HasField("cToken") else None,
        )


def metadata_dict(ledger_id: int, md: LedgerMetadata, version: int | None) -> dict:
    """A ledger's metadata as JSON-ready fields (the shell's --json and the HTTP admin API)."""
    return {
        "ledger_id": ledger_id, "version": version, "state": md.state.name,
        "ensemble_size": md.ensemble_size, "write_quorum_size": md.write_quorum_size,
        "ack_quorum_size": md.ack_quorum_size, "last_entry_id": md.last_entry_id, "length": md.length,
        "digest_type": md.digest_type.name if md.digest_type is not None else None,
        "ctime": md.ctime, "segments": [{"first_entry_id": s[0], "bookies": list(s[1])} for s in md.segments],
        "custom_metadata": {k: base64.b64encode(v).decode() for k, v in md.custom.items()},
    }
