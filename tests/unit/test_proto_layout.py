"""The one layout module: the generated Cython copy is current, and the names say what PROTOCOL.md says."""
import pathlib

from bk.proto import layout
from bk.proto.constants import OpCode, StatusCode, V2_STATUS_BY_V3, V3_STATUS
from bk import errors

PXI = pathlib.Path(__file__).resolve().parents[2] / "bk" / "_native" / "wire_layout.pxi"


def test_generated_pxi_is_current():
    # setup.py rewrites it before a build; a stale committed copy would compile old numbers
    assert PXI.read_text() == layout.pxi_text()


def test_sizes_follow_protocol_md():
    assert layout.ADD_REQUEST_MIN_BYTES == 56 and layout.ADD_RESPONSE_BYTES == 24
    assert layout.READ_REQUEST_BYTES == 20 and layout.BATCH_READ_REQUEST_BYTES == 40
    assert layout.BATCH_READ_RESPONSE_HEADER_BYTES == 32 and layout.READ_RESPONSE_HEADER_BYTES == 24
    assert layout.WRITE_LAC_REQUEST_MIN_BYTES == 56 and layout.GET_BOOKIE_INFO_RESPONSE_BYTES == 24
    assert layout.FRAME_HEAD.size == layout.FRAME_LENGTH_BYTES + layout.HEADER_BYTES


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
