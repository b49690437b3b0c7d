# GENERATED from bk/proto/layout.py by setup.py (layout.pxi_text()): do not edit.
# tests/unit/test_proto_layout.py fails when this copy is stale.
cdef enum:
    WL_MAX_ACCEPTED_VERSION = 2
    WL_OP_ADD_ENTRY = 1
    WL_FLAG_RECOVERY_ADD = 2
    WL_HEADER_BYTES = 4
    WL_MASTER_KEY_LENGTH = 20
    WL_ENTRY_HEADER_LENGTH = 32
    WL_ENTRY_LAC_OFFSET = 16
    WL_ADD_KEY_OFFSET = 4
    WL_ADD_ENTRY_OFFSET = 24
    WL_ADD_REQUEST_MIN_BYTES = 56
    WL_ADD_RESPONSE_BYTES = 24
    WL_RESPONSE_RC_OFFSET = 4
    WL_RESPONSE_IDS_OFFSET = 8
    WL_FRAME_LENGTH_BYTES = 4
    WL_ID_BYTES = 8
    WL_CRC32C_DIGEST_LENGTH = 4
