"""BookKeeper's metadata protobuf messages, built at runtime (no protoc).

The descriptors are declared here as a proto2 `FileDescriptorProto` with the
message names, field names (BookKeeper's camelCase, so the text format matches
what Java's TextFormat prints) and field numbers of METADATA.md, and turned
into classes with `message_factory.GetMessageClass` from a private
descriptor pool (nothing is registered in the default pool).

Messages: LedgerMetadataFormat (binary, in ledger znodes), UnderreplicatedLedgerFormat,
LockDataFormat, AuditorVoteFormat, CookieFormat (text format), and
BookieServiceInfoFormat (binary, in `available/<bookie>` znodes).
"""
from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format
from google.protobuf.message import DecodeError, EncodeError, Message

from bk.errors import MetadataFormatError

_F = descriptor_pb2.FieldDescriptorProto
REQUIRED, OPTIONAL, REPEATED = _F.LABEL_REQUIRED, _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
INT32, INT64, STRING, BYTES = _F.TYPE_INT32, _F.TYPE_INT64, _F.TYPE_STRING, _F.TYPE_BYTES
ENUM, MESSAGE = _F.TYPE_ENUM, _F.TYPE_MESSAGE

_PACKAGE = "bk.meta.dataformats"


def _field(msg, name: str, number: int, label: int, ftype: int, type_name: str = "", default: str = ""):
    f = msg.field.add(name=name, number=number, label=label, type=ftype)
    if type_name:
        f.type_name = f".{_PACKAGE}.{type_name}"
    if default:
        f.default_value = default
    return f


def _enum(parent, name: str, values: dict[str, int]) -> None:
    e = parent.enum_type.add(name=name)
    for value_name, number in values.items():
        e.value.add(name=value_name, number=number)


def _build_file() -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto(name="bk/meta/DataFormats.proto", package=_PACKAGE, syntax="proto2")

    # LedgerMetadataFormat: the data of a ledger znode (format version 3).
    lm = fdp.message_type.add(name="LedgerMetadataFormat")
    _enum(lm, "State", {"OPEN": 1, "IN_RECOVERY": 2, "CLOSED": 3})
    _enum(lm, "DigestType", {"CRC32": 1, "HMAC": 2, "CRC32C": 3, "DUMMY": 4})
    seg = lm.nested_type.add(name="Segment")
    _field(seg, "ensembleMember", 1, REPEATED, STRING)
    _field(seg, "firstEntryId", 2, REQUIRED, INT64)
    cm = lm.nested_type.add(name="cMetadataMapEntry")
    _field(cm, "key", 1, OPTIONAL, STRING)
    _field(cm, "value", 2, OPTIONAL, BYTES)
    _field(lm, "quorumSize", 1, REQUIRED, INT32)
    _field(lm, "ensembleSize", 2, REQUIRED, INT32)
    _field(lm, "length", 3, REQUIRED, INT64)
    _field(lm, "lastEntryId", 4, OPTIONAL, INT64)
    _field(lm, "state", 5, REQUIRED, ENUM, "LedgerMetadataFormat.State", default="OPEN")
    _field(lm, "segment", 6, REPEATED, MESSAGE, "LedgerMetadataFormat.Segment")
    _field(lm, "digestType", 7, OPTIONAL, ENUM, "LedgerMetadataFormat.DigestType")
    _field(lm, "password", 8, OPTIONAL, BYTES)
    _field(lm, "ackQuorumSize", 9, OPTIONAL, INT32)
    _field(lm, "ctime", 10, OPTIONAL, INT64)
    _field(lm, "customMetadata", 11, REPEATED, MESSAGE, "LedgerMetadataFormat.cMetadataMapEntry")
    _field(lm, "cToken", 12, OPTIONAL, INT64)

    ur = fdp.message_type.add(name="UnderreplicatedLedgerFormat")
    _field(ur, "replica", 1, REPEATED, STRING)
    _field(ur, "ctime", 2, OPTIONAL, INT64)

    lock = fdp.message_type.add(name="LockDataFormat")
    _field(lock, "bookieId", 1, OPTIONAL, STRING)

    vote = fdp.message_type.add(name="AuditorVoteFormat")
    _field(vote, "bookieId", 1, OPTIONAL, STRING)

    cookie = fdp.message_type.add(name="CookieFormat")
    _field(cookie, "bookieHost", 1, REQUIRED, STRING)
    _field(cookie, "journalDir", 2, REQUIRED, STRING)
    _field(cookie, "ledgerDirs", 3, REQUIRED, STRING)
    _field(cookie, "instanceId", 4, OPTIONAL, STRING)
    _field(cookie, "indexDirs", 5, OPTIONAL, STRING)

    # the auditor's last run of each periodic check (ms since the epoch), as BookKeeper keeps them
    for name, fieldname in (("CheckAllLedgersFormat", "checkAllLedgersCTime"),
                            ("PlacementPolicyCheckFormat", "placementPolicyCheckCTime"),
                            ("ReplicasCheckFormat", "replicasCheckCTime")):
        _field(fdp.message_type.add(name=name), fieldname, 1, OPTIONAL, INT64)

    bsi = fdp.message_type.add(name="BookieServiceInfoFormat")
    ep = bsi.nested_type.add(name="Endpoint")
    _field(ep, "id", 1, REQUIRED, STRING)
    _field(ep, "port", 2, REQUIRED, INT32)
    _field(ep, "host", 3, REQUIRED, STRING)
    _field(ep, "protocol", 4, REQUIRED, STRING)
    _field(ep, "auth", 5, REPEATED, STRING)
    _field(ep, "extensions", 6, REPEATED, STRING)
    # map<string, string> properties = 7: a repeated map-entry message, as protoc emits it.
    entry = bsi.nested_type.add(name="PropertiesEntry")
    entry.options.map_entry = True
    _field(entry, "key", 1, OPTIONAL, STRING)
    _field(entry, "value", 2, OPTIONAL, STRING)
    _field(bsi, "endpoints", 6, REPEATED, MESSAGE, "BookieServiceInfoFormat.Endpoint")
    _field(bsi, "properties", 7, REPEATED, MESSAGE, "BookieServiceInfoFormat.PropertiesEntry")
    return fdp


_POOL = descriptor_pool.DescriptorPool()
_FILE = _POOL.Add(_build_file())


def _cls(name: str):
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PACKAGE}.{name}"))


LedgerMetadataFormat = _cls("LedgerMetadataFormat")
UnderreplicatedLedgerFormat = _cls("UnderreplicatedLedgerFormat")
LockDataFormat = _cls("LockDataFormat")
AuditorVoteFormat = _cls("AuditorVoteFormat")
CookieFormat = _cls("CookieFormat")
BookieServiceInfoFormat = _cls("BookieServiceInfoFormat")
CheckAllLedgersFormat = _cls("CheckAllLedgersFormat")
PlacementPolicyCheckFormat = _cls("PlacementPolicyCheckFormat")
ReplicasCheckFormat = _cls("ReplicasCheckFormat")


# ---------------------------------------------------------------------- codecs
def to_binary(msg: Message) -> bytes:
    try:
        return msg.SerializeToString()
    except EncodeError as e:
        raise MetadataFormatError(f"cannot encode {msg.DESCRIPTOR.name}: {e}") from None


def from_binary(cls, data: bytes) -> Message:
    msg = cls()
    try:
        msg.ParseFromString(bytes(data))
    except (DecodeError, ValueError, TypeError) as e:
        raise MetadataFormatError(f"malformed {cls.DESCRIPTOR.name}: {e}") from None
    if not msg.IsInitialized():
        missing = ", ".join(msg.FindInitializationErrors())
        raise MetadataFormatError(f"malformed {cls.DESCRIPTOR.name}: missing required {missing}")
    return msg


def to_text(msg: Message) -> str:
    """Protobuf text format as Java's TextFormat.printToString writes it."""
    if not msg.IsInitialized():
        missing = ", ".join(msg.FindInitializationErrors())
        raise MetadataFormatError(f"cannot encode {msg.DESCRIPTOR.name}: missing required {missing}")
    return text_format.MessageToString(msg)


def from_text(cls, text: str | bytes) -> Message:
    if isinstance(text, (bytes, bytearray, memoryview)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise MetadataFormatError(f"malformed {cls.DESCRIPTOR.name}: not UTF-8 text ({e})") from None
    msg = cls()
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError as e:
        raise MetadataFormatError(f"malformed {cls.DESCRIPTOR.name} text: {e}") from None
    if not msg.IsInitialized():
        missing = ", ".join(msg.FindInitializationErrors())
        raise MetadataFormatError(f"malformed {cls.DESCRIPTOR.name}: missing required {missing}")
    return msg


def encode_varint32(value: int) -> bytes:
    """Unsigned base-128 varint, as protobuf's writeDelimitedTo writes the length."""
    if not 0 <= value < 1 << 32:
        raise MetadataFormatError(f"varint32 out of range: {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_varint32(data: bytes, offset: int = 0) -> tuple[int, int]:
    """(value, offset after it); at most 5 bytes."""
    value = 0
    for i in range(5):
        if offset + i >= len(data):
            raise MetadataFormatError("truncated varint32 length")
        byte = data[offset + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            if value >= 1 << 32:
                raise MetadataFormatError("varint32 length out of range")
            return value, offset + i + 1
    raise MetadataFormatError("varint32 length longer than 5 bytes")
