"""Metadata byte formats: ledger metadata (v3), cookies, service info, paths, URIs.

`decode_ledger_znode` is an independent protobuf reader written from
METADATA.md's field table (varints and length-delimited fields by hand), so
the field numbers are proven without trusting bk.meta.formats.
"""
from __future__ import annotations

import random

import pytest

from bk.errors import LedgerClosedError, MetadataFormatError, MetadataStoreError
from bk.meta import formats
from bk.meta.cookie import Cookie, decode_dir_paths, encode_dir_paths
from bk.meta.ledger_manager import MAX_LEDGER_ID, ledger_id_from_path, ledger_path
from bk.meta.ledger_metadata import DigestType, LedgerMetadata, LedgerState
from bk.meta.registration import BookieServiceInfo, Endpoint, split_bookie_id
from bk.meta.store import parse_metadata_uri
from bk.meta.underreplication import ur_ledger_path

# ---------------------------------------------------------------------- a reader by hand
LEDGER_FIELDS = {
    1: "quorumSize", 2: "ensembleSize", 3: "length", 4: "lastEntryId", 5: "state", 6: "segment",
    7: "digestType", 8: "password", 9: "ackQuorumSize", 10: "ctime", 11: "customMetadata", 12: "cToken",
}


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def _fields(buf: bytes) -> list[tuple[int, object]]:
    out, i = [], 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, i = _varint(buf, i)
        elif wire_type == 2:
            size, i = _varint(buf, i)
            value, i = buf[i : i + size], i + size
        else:
            raise AssertionError(f"unexpected wire type {wire_type} for field {number}")
        out.append((number, value))
    return out


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def decode_ledger_znode(raw: bytes) -> dict:
    header = b"BookieMetadataFormatVersion\t3\n"
    assert raw.startswith(header)
    size, start = _varint(raw, len(header))
    body = raw[start:]
    assert len(body) == size
    out: dict = {"segments": [], "customMetadata": []}
    for number, value in _fields(body):
        name = LEDGER_FIELDS[number]
        if name == "segment":
            members, first = [], None
            for n, v in _fields(value):
                if n == 1:
                    members.append(v.decode())
                elif n == 2:
                    first = _signed64(v)
            out["segments"].append((first, members))
        elif name == "customMetadata":
            entry = dict(_fields(value))
            out["customMetadata"].append((entry[1].decode(), entry[2]))
        elif name == "password":
            out[name] = value
        else:
            out[name] = _signed64(value)
    return out


# ---------------------------------------------------------------------- ledger metadata
def test_new_ledger_metadata_is_open_with_one_segment():
    md = LedgerMetadata.new(["a:1", "b:1", "c:1"], 3, 2, password=b"pw")
    assert (md.ensemble_size, md.write_quorum_size, md.ack_quorum_size) == (3, 3, 2)
    assert md.state is LedgerState.OPEN and md.last_entry_id == -1 and md.length == 0
    assert md.segments == ((0, ("a:1", "b:1", "c:1")),)
    assert md.ctime > 0 and md.ctoken is not None


def test_serialize_roundtrip_and_field_numbers():
    md = (
        LedgerMetadata.new(["a:1", "b:1", "c:1"], 2, 2, digest_type=DigestType.HMAC, password=b"\x00pw",
                           custom_metadata={"z": b"1", "a": b"\xff"})
        .with_ensemble_change(10, ["a:1", "d:1", "c:1"])
        .with_ensemble_change(20, ["e:1", "d:1", "c:1"])
        .with_closed(25, 4096)
    )
    raw = md.serialize()
    assert LedgerMetadata.deserialize(raw) == md
    fields = decode_ledger_znode(raw)
    assert fields["quorumSize"] == 2 and fields["ensembleSize"] == 3 and fields["ackQuorumSize"] == 2
    assert fields["state"] == 3 and fields["lastEntryId"] == 25 and fields["length"] == 4096
    assert fields["digestType"] == 2 and fields["password"] == b"\x00pw"
    assert [first for first, _ in fields["segments"]] == [0, 10, 20]
    assert fields["customMetadata"] == [("a", b"\xff"), ("z", b"1")]


def test_open_ledger_writes_last_entry_minus_one():
    raw = LedgerMetadata.new(["a:1"], 1, 1).serialize()
    fields = decode_ledger_znode(raw)
    assert fields["lastEntryId"] == -1 and fields["length"] == 0 and fields["state"] == 1


def test_minimal_bookkeeper_metadata_without_optional_fields_decodes():
    msg = formats.LedgerMetadataFormat(quorumSize=2, ensembleSize=2, length=0, state=1)
    seg = msg.segment.add()
    seg.ensembleMember.extend(["a:1", "b:1"])
    seg.firstEntryId = 0
    body = msg.SerializeToString()
    md = LedgerMetadata.deserialize(b"BookieMetadataFormatVersion\t3\n" + bytes([len(body)]) + body)
    assert md.ack_quorum_size == 2 and md.last_entry_id == -1
    assert md.digest_type is None and md.password is None and md.ctime is None and md.ctoken is None
    assert LedgerMetadata.deserialize(md.serialize()) == md


def test_version_2_text_metadata_is_read():
    text = (
        b"BookieMetadataFormatVersion\t2\n"
        b'quorumSize: 2\nensembleSize: 2\nlength: 10\nlastEntryId: 3\nstate: CLOSED\n'
        b'segment {\n  ensembleMember: "a:1"\n  ensembleMember: "b:1"\n  firstEntryId: 0\n}\n'
    )
    md = LedgerMetadata.deserialize(text)
    assert md.is_closed and md.last_entry_id == 3 and md.length == 10


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"garbage",
        b"BookieMetadataFormatVersion\t9\n\x00",
        b"BookieMetadataFormatVersion\tx\n\x00",
        b"BookieMetadataFormatVersion\t3\n",
        b"BookieMetadataFormatVersion\t3\n\x05\x08\x02",
        b"BookieMetadataFormatVersion\t3\n\x02\x08\x02",  # required fields missing
        b"BookieMetadataFormatVersion\t3\n\x02\xff\xff",
    ],
)
def test_malformed_ledger_metadata_is_a_format_error(raw):
    with pytest.raises(MetadataFormatError):
        LedgerMetadata.deserialize(raw)


def test_trailing_bytes_after_the_message_are_refused():
    raw = LedgerMetadata.new(["a:1"], 1, 1).serialize()
    with pytest.raises(MetadataFormatError, match="length prefix"):
        LedgerMetadata.deserialize(raw + b"\x00")


def test_random_corruption_never_escapes_as_another_error():
    rng = random.Random(7)
    raw = LedgerMetadata.new(["a:1", "b:1"], 2, 1, password=b"k").serialize()
    for _ in range(2000):
        data = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        data = bytes(data[: rng.randint(0, len(data))]) if rng.random() < 0.3 else bytes(data)
        try:
            LedgerMetadata.deserialize(data)
        except MetadataFormatError:
            pass


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(ensemble_size=2, write_quorum_size=3, ack_quorum_size=1, segments=((0, ("a", "b")),)), "quorum"),
        (dict(ensemble_size=2, write_quorum_size=2, ack_quorum_size=0, segments=((0, ("a", "b")),)), "quorum"),
        (dict(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2, segments=()), "no segments"),
        (dict(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2, segments=((1, ("a", "b")),)), "not 0"),
        (dict(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2, segments=((0, ("a",)),)), "ensemble size"),
        (dict(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2, segments=((0, ("a", "a")),)), "repeated"),
        (dict(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1,
              segments=((0, ("a",)), (5, ("b",)), (5, ("c",)))), "increasing"),
        (dict(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, segments=((0, ("a",)),),
              last_entry_id=-2), "last entry"),
        (dict(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, segments=((0, ("a",)),), state=9), "9"),
        (dict(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, segments=((0, "ab"),)), "string"),
    ],
)
def test_invalid_ledger_metadata_is_refused(kwargs, match):
    with pytest.raises(MetadataFormatError, match=match):
        LedgerMetadata(**kwargs)


def test_state_machine_and_ensembles():
    md = LedgerMetadata.new(["a:1", "b:1", "c:1"], 2, 2)
    changed = md.with_ensemble_change(5, ["a:1", "d:1", "c:1"])
    assert md.segments == ((0, ("a:1", "b:1", "c:1")),)  # the original value is untouched
    assert changed.ensemble_for(0) == changed.ensemble_for(4) == ("a:1", "b:1", "c:1")
    assert changed.ensemble_for(5) == changed.ensemble_for(10**9) == ("a:1", "d:1", "c:1")
    # a second change at the same entry (the new segment stayed empty) replaces it
    again = changed.with_ensemble_change(5, ["e:1", "d:1", "c:1"])
    assert again.segments[1] == (5, ("e:1", "d:1", "c:1")) and len(again.segments) == 2
    with pytest.raises(MetadataFormatError):
        changed.with_ensemble_change(3, ["a:1", "b:1", "c:1"])
    with pytest.raises(MetadataFormatError):
        changed.ensemble_for(-1)
    recovering = changed.with_in_recovery()
    closed = recovering.with_closed(7, 700)
    assert closed.is_closed and closed.segment_end(0) == 4 and closed.segment_end(1) == 7
    assert changed.segment_end(1) == -1
    assert closed.with_closed(7, 700) is closed
    with pytest.raises(LedgerClosedError):
        closed.with_closed(8, 800)
    with pytest.raises(LedgerClosedError):
        closed.with_ensemble_change(8, ["a:1", "b:1", "c:1"])
    with pytest.raises(LedgerClosedError):
        closed.with_in_recovery()
    repaired = closed.with_segment_replaced(0, ["x:1", "b:1", "c:1"])  # re-replication of a closed ledger
    assert repaired.ensemble_for(0) == ("x:1", "b:1", "c:1") and repaired.last_entry_id == 7
    with pytest.raises(MetadataFormatError):
        closed.with_segment_replaced(3, ["x:1", "b:1", "c:1"])
    assert closed.bookies() == {"a:1", "b:1", "c:1", "d:1"}


def test_varint32():
    for value in (0, 1, 127, 128, 300, 2**21, 2**32 - 1):
        encoded = formats.encode_varint32(value)
        assert formats.decode_varint32(encoded + b"rest") == (value, len(encoded))
    with pytest.raises(MetadataFormatError):
        formats.encode_varint32(2**32)
    with pytest.raises(MetadataFormatError):
        formats.decode_varint32(b"\x80\x80")
    with pytest.raises(MetadataFormatError):
        formats.decode_varint32(b"\xff\xff\xff\xff\xff\x01")


# ---------------------------------------------------------------------- paths
def test_hierarchical_ledger_paths():
    assert ledger_path("/ledgers", 1) == "/ledgers/00/0000/L0001"
    assert ledger_path("/ledgers", 1234567890) == "/ledgers/12/3456/L7890"
    assert ledger_path("/ledgers", 0) == "/ledgers/00/0000/L0000"
    assert ledger_path("/a/b/", 2**31 - 2) == "/a/b/21/4748/L3646"
    # from 2^31-1 on: BookKeeper's long hierarchical layout, 19 digits split 3/4/4/4/4
    assert ledger_path("/ledgers", 2**31 - 1) == "/ledgers/000/0000/0021/4748/L3647"
    assert ledger_path("/ledgers", (1 << 32) | 5) == "/ledgers/000/0000/0042/9496/L7301"
    assert ledger_path("/ledgers", MAX_LEDGER_ID) == "/ledgers/922/3372/0368/5477/L5807"
    for ledger_id in (0, 1, 99999, 1234567890, 2**31 - 2, 2**31 - 1, (7 << 32) | 9, MAX_LEDGER_ID):
        assert ledger_id_from_path("/ledgers", ledger_path("/ledgers", ledger_id)) == ledger_id
    with pytest.raises(MetadataStoreError):
        ledger_path("/ledgers", 2**63)
    with pytest.raises(MetadataStoreError):
        ledger_path("/ledgers", -5)
    for bad in ("/ledgers/available", "/ledgers/00/0000/X0001", "/other/00/0000/L0001", "/ledgers/0/0000/L0001",
                "/ledgers/000/0000/0000/0000/L0001"):  # a long path for a short id: not BookKeeper's
        with pytest.raises(MetadataFormatError):
            ledger_id_from_path("/ledgers", bad)


def test_underreplication_paths_split_the_id_in_hex_groups():
    assert ur_ledger_path("/ledgers/underreplication/ledgers", 1) == (
        "/ledgers/underreplication/ledgers/0000/0000/0000/0001/urL0000000001"
    )
    assert ur_ledger_path("/u", 0x7BCD_0123_4567_89EF) == (
        f"/u/7bcd/0123/4567/89ef/urL{0x7BCD_0123_4567_89EF:010d}"
    )


def test_metadata_uris():
    uri = parse_metadata_uri("zk://zk1:2181,zk2:2182/ledgers")
    assert (uri.scheme, uri.hosts, uri.root) == ("zk", "zk1:2181,zk2:2182", "/ledgers")
    assert parse_metadata_uri("zk+hierarchical://zk1;zk2:3000/a/b").hosts == "zk1:2181,zk2:3000"
    assert parse_metadata_uri("zk+hierarchical://zk1;zk2:3000/a/b").root == "/a/b"
    assert parse_metadata_uri("zk://h:1").root == "/ledgers"
    assert parse_metadata_uri("mem://cluster-1/ledgers") == parse_metadata_uri("mem://cluster-1")
    for bad in ("zk://", "zk://h:1/a//b", "file:///x", "mem:///ledgers", "zk://h:99999/x"):
        with pytest.raises(MetadataStoreError):
            parse_metadata_uri(bad)


# ---------------------------------------------------------------------- cookies
def test_cookie_text_is_bookkeepers():
    cookie = Cookie("127.0.0.1:3181", ("/j1", "/j2"), ("/l1", "/l2"), "iid-1", ("/i",))
    assert cookie.to_text() == (
        "5\n"
        'bookieHost: "127.0.0.1:3181"\n'
        'journalDir: "/j1,/j2"\n'
        'ledgerDirs: "2\\t/l1\\t/l2"\n'
        'instanceId: "iid-1"\n'
        'indexDirs: "1\\t/i"\n'
    )
    assert Cookie.parse(cookie.to_bytes()) == cookie
    plain = Cookie("h:1", ("/j",), ("/l",))
    assert Cookie.parse(plain.to_text()) == plain and "instanceId" not in plain.to_text()


def test_cookie_layouts_3_and_4_are_read():
    v4 = '4\nbookieHost: "h:1"\njournalDir: "/j"\nledgerDirs: "1\\t/l"\ninstanceId: ""\n'
    cookie = Cookie.parse(v4)
    assert (cookie.layout_version, cookie.instance_id, cookie.ledger_dirs) == (4, None, ("/l",))
    assert Cookie.parse("3\nh:1\n/j\n2\t/a\t/b\n").ledger_dirs == ("/a", "/b")
    assert not Cookie.parse(v4).differences(Cookie("h:1", ("/j",), ("/l",)))


@pytest.mark.parametrize(
    "text",
    ["", "x\n", "2\nold", "5\nbookieHost: \"h\"\n", "5\nnot protobuf {", "5\n" + 'bookieHost: "h"\njournalDir: "/j"\n'
     'ledgerDirs: "3\\t/a"\n', b"\xff\xfe"],
)
def test_malformed_cookies_are_format_errors(text):
    with pytest.raises(MetadataFormatError):
        Cookie.parse(text)


def test_dir_path_lists():
    assert encode_dir_paths(("/a", "/b")) == "2\t/a\t/b"
    assert decode_dir_paths("2\t/a\t/b") == ("/a", "/b")
    assert decode_dir_paths(encode_dir_paths(())) == ()
    with pytest.raises(MetadataFormatError):
        decode_dir_paths("/a\t/b")


def test_cookie_differences_name_the_fields():
    stored = Cookie("h:1", ("/j",), ("/l1",), "x")
    expected = Cookie("h:2", ("/j",), ("/l1", "/l2"), "x")
    diff = stored.differences(expected)
    assert diff == ["bookie_host: stored 'h:1', expected 'h:2'", "ledger_dirs: stored [/l1], expected [/l1, /l2]"]


# ---------------------------------------------------------------------- service info
def test_bookie_service_info_roundtrip_and_field_numbers():
    info = BookieServiceInfo(
        (Endpoint("bookie", "10.0.0.1", 3181, "bookie-rpc", ("tls",), ("ext",)),
         Endpoint("http", "10.0.0.1", 8000, "http")),
        {"rack": "/r1", "autorecovery": "true"},
    )
    raw = info.serialize()
    assert BookieServiceInfo.deserialize(raw) == info
    top = _fields(raw)
    assert [n for n, _ in top] == [6, 6, 7, 7]  # endpoints = 6, properties = 7
    endpoint = dict(_fields(top[0][1]))
    assert endpoint == {1: b"bookie", 2: 3181, 3: b"10.0.0.1", 4: b"bookie-rpc", 5: b"tls", 6: b"ext"}
    assert {tuple(v for _, v in _fields(entry)) for n, entry in top if n == 7} == {
        (b"rack", b"/r1"), (b"autorecovery", b"true")}
    with pytest.raises(MetadataFormatError):
        BookieServiceInfo.deserialize(b"\x32\x02\x0a")


def test_bookie_ids():
    assert split_bookie_id("127.0.0.1:3181") == ("127.0.0.1", 3181)
    assert split_bookie_id("[::1]:3181") == ("::1", 3181)
    for bad in ("nohost", ":3181", "h:0", "h:x", "h:70000"):
        with pytest.raises(MetadataStoreError):
            split_bookie_id(bad)


def test_text_messages_use_bookkeepers_field_names():
    assert formats.to_text(formats.LockDataFormat(bookieId="b:1")) == 'bookieId: "b:1"\n'
    assert formats.to_text(formats.AuditorVoteFormat(bookieId="b:1")) == 'bookieId: "b:1"\n'
    ur = formats.UnderreplicatedLedgerFormat(replica=["a:1", "b:1"], ctime=5)
    assert formats.to_text(ur) == 'replica: "a:1"\nreplica: "b:1"\nctime: 5\n'
    assert _fields(formats.to_binary(ur)) == [(1, b"a:1"), (1, b"b:1"), (2, 5)]
