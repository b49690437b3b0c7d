"""The one layout package (bk/formats): the generated Cython copy is current, a name means one
thing across the package, the package is a leaf, and the names say what PROTOCOL.md and
STORAGE.md say."""
import ast
import pathlib
import sys

from bk import errors
from bk.formats import entry, entrylog, index, journal, pxi
from bk.formats import wire as layout
from bk.proto.constants import DIGEST_LENGTH_BYTES, DigestType, OpCode, StatusCode, V2_STATUS_BY_V3, V3_STATUS

ROOT = pathlib.Path(__file__).resolve().parents[2]
PXI = ROOT.joinpath(*pxi.PXI_PATH)
MODULES = (entry, layout, journal, entrylog, index)


def test_generated_pxi_is_current():
    # setup.py rewrites it before a build; a stale committed copy would compile old numbers
    assert PXI.read_text() == pxi.pxi_text()


def test_a_name_means_one_thing_across_the_package():
    # HEADER_BYTES was 4 (wire), 16 (journal) and 1024 (entry log): every public constant is
    # now defined in one module and only re-exported (the same object) by the others
    seen = {}
    for module in MODULES:
        for name, value in vars(module).items():
            if name.isupper() and name != "CYTHON_NAMES":
                if name in seen:
                    assert seen[name][1] is value, f"{name} is {seen[name]} and {module.__name__}'s {value!r}"
                seen.setdefault(name, (module.__name__, value))
    for name in ("HEADER_BYTES", "MAGIC", "VERSION", "RECORD_BYTES", "KEY_BYTES", "V2_HEADER_BYTES"):
        assert name not in seen, f"{name} is ambiguous; name what it is the size of"


def test_the_package_is_a_leaf():
    for path in (ROOT / "bk" / "formats").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert not name.startswith("bk.") or name.startswith("bk.formats"), f"{path.name} imports {name}"
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top in {"bk", "google_crc32c"}, f"{path.name} imports {name}"


def test_disk_layouts_follow_storage_md():
    assert (journal.JOURNAL_V1_HEADER.size, journal.JOURNAL_V2_HEADER.size) == \
        (journal.JOURNAL_V1_HEADER_BYTES, journal.JOURNAL_V2_HEADER_BYTES) == (16, 20)
    assert journal.JOURNAL_RECORD_HEAD.size == journal.JOURNAL_RECORD_HEAD_BYTES == 8
    assert journal.JOURNAL_V2_HEADER.size - 4 == journal.JOURNAL_ALIGNMENT_OFFSET
    assert entrylog.LOG_HEADER_BYTES == 1024 and entrylog.LOG_SIZE_FIELD.size == entrylog.LOG_SIZE_FIELD_BYTES == 4
    assert entrylog.LOG_RECORD_HEAD.size == entrylog.LOG_RECORD_HEAD_BYTES == 20
    assert entrylog.LOG_HEADER.unpack_from(entrylog.encode_header(7, 2048, 3)) == (b"BKLO", 1, 7, 2048, 3)
    assert entrylog.encode_header(7)[entrylog.LOG_MAP_FIELDS_OFFSET:][:entrylog.LOG_MAP_FIELDS.size] == \
        entrylog.LOG_MAP_FIELDS.pack(0, 0)
    assert index.LOCATION_KEY.size == index.LOCATION_KEY_BYTES and index.LOCATION_VALUE.size == index.LOCATION_VALUE_BYTES
    assert index.LOCATION_RECORD.size == index.LOCATION_RECORD_BYTES == 24
    assert entry.ENTRY_HEADER.size == entry.ENTRY_HEADER_LENGTH and entry.LAC_HEADER.size == entry.LAC_HEADER_LENGTH
    assert entry.ENTRY_IDS.size == entry.ENTRY_IDS_BYTES == journal.JOURNAL_MIN_BODY_BYTES == entrylog.LOG_MIN_ENTRY_BYTES


def test_pure_crc_framing_is_the_clients():
    # spark/ frames and checks entries with bk.formats.entry; the client with DigestManager
    from bk.proto.digest import DigestManager
    for kind in (DigestType.CRC32C, DigestType.CRC32):
        dm = DigestManager(5, kind)
        framed = dm.frame_entry(3, 2, 40, b"payload")
        assert entry.entry_crc_matches(framed, int(kind)) is True
        assert entry.entry_crc_matches(framed[:-1] + b"X", int(kind)) is False
        assert DIGEST_LENGTH_BYTES[kind] == entry.DIGEST_LENGTH_BY_TYPE[int(kind)]
    assert entry.crc32c_entry(5, 3, 2, 40, b"payload") == DigestManager(5, DigestType.CRC32C).frame_entry(3, 2, 40, b"payload")
    assert entry.entry_crc_matches(b"short", int(DigestType.CRC32C)) is None
    assert entry.entry_crc_matches(DigestManager(5, DigestType.MAC).frame_entry(3, 2, 40, b"p"), int(DigestType.MAC)) is None


def test_sizes_follow_protocol_md():
    assert layout.ADD_REQUEST_MIN_BYTES == 56 and layout.ADD_RESPONSE_BYTES == 24
    assert layout.READ_REQUEST_BYTES == 20 and layout.BATCH_READ_REQUEST_BYTES == 40
    assert layout.BATCH_READ_RESPONSE_HEADER_BYTES == 32 and layout.READ_RESPONSE_HEADER_BYTES == 24
    assert layout.WRITE_LAC_REQUEST_MIN_BYTES == 56 and layout.GET_BOOKIE_INFO_RESPONSE_BYTES == 24
    assert layout.FRAME_HEAD.size == layout.FRAME_LENGTH_BYTES + layout.PACKET_HEADER_BYTES


def test_header_packer():
    assert layout.pack_header(2, 1) == 0x02010000 == layout.ADD_HEADER
    assert layout.ADD_RECOVERY_HEADER == 0x02010002
    assert layout.pack_header(0, 2) == 2
    assert layout.split_header(layout.pack_header(2, 7, 5)) == (2, 7, 5)
    for bad in ((3, 1, 0), (2, 256, 0), (2, 1, 1 << 16), (0, 1, 1)):
        try:
            layout.pack_header(*bad)
        except ValueError:
            continue
        raise AssertionError(f"pack_header{bad} accepted")


def test_one_status_table():
    # StatusCode and both v2<->v3 maps are the exception classes' codes, nothing else
    assert {int(s) for s in StatusCode} == {0} | {cls.code for cls in errors.STATUS_CLASSES}
    for cls in errors.STATUS_CLASSES:
        assert StatusCode[cls.name] == cls.code and V3_STATUS[StatusCode(cls.code)] == cls.v3_code
        assert V2_STATUS_BY_V3[cls.v3_code] == cls.code
    assert V3_STATUS[StatusCode.EUNKNOWNLEDGERSTATE] == 507  # BookkeeperProtocol.proto
    assert list(OpCode) == sorted(OpCode) and OpCode.ADD_ENTRY == layout.OP_ADD_ENTRY


def test_bookie_info_bits_are_bookkeepers():
    # GetBookieInfoRequest.Flags: TOTAL_DISK_CAPACITY = 0x01, FREE_DISK_SPACE = 0x02
    assert (layout.BOOKIE_INFO_TOTAL_DISK_CAPACITY, layout.BOOKIE_INFO_FREE_DISK_SPACE) == (1, 2)
