"""Sans-I/O BookKeeper v2 wire protocol: constants, messages, codec, framing, digests.

No sockets and no asyncio here: the server and client adapters feed bytes in and
write the bytes these functions return. See /work/shared/docs/PROTOCOL.md and
docs/PROTOCOL-EXTENSIONS.md (READ_LAC, WRITE_LAC, GET_BOOKIE_INFO layouts).
"""
from bk.proto.codec import (
    decode_request, decode_response, encode_add_acks, encode_add_responses, encode_error_response, encode_header,
    encode_request, encode_response, error_response_for, split_header,
)
from bk.proto.constants import (
    DEFAULT_MAX_FRAME_SIZE_BYTES, FLAG_DO_FENCING, FLAG_HIGH_PRIORITY, FLAG_RECOVERY_ADD, PROTOCOL_VERSION,
    V3_STATUS, OpCode, StatusCode,
)
from bk.proto.digest import DigestManager, DigestType, UnknownDigestTypeError, parse_digest_type
from bk.proto.framing import FrameDecoder
from bk.proto.masterkey import keys_equal, master_key
from bk.proto.messages import (
    AddRequest, AddResponse, AuthRequest, AuthResponse, BadFrameLengthError, BatchReadRequest,
    BatchReadResponse, GetBookieInfoRequest, GetBookieInfoResponse, MessageEncodeError, ReadLacRequest,
    ReadLacResponse, ReadRequest, ReadResponse, RequestDecodeError, RequestVersionError, ResponseDecodeError,
    WriteLacRequest, WriteLacResponse,
)

__all__ = [
    "AddRequest", "AddResponse", "AuthRequest", "AuthResponse", "BadFrameLengthError", "BatchReadRequest",
    "BatchReadResponse", "DEFAULT_MAX_FRAME_SIZE_BYTES", "DigestManager", "DigestType", "FLAG_DO_FENCING",
    "FLAG_HIGH_PRIORITY", "FLAG_RECOVERY_ADD", "FrameDecoder", "GetBookieInfoRequest", "GetBookieInfoResponse",
    "MessageEncodeError", "OpCode", "PROTOCOL_VERSION", "ReadLacRequest", "ReadLacResponse", "ReadRequest",
    "ReadResponse", "RequestDecodeError", "RequestVersionError", "ResponseDecodeError", "StatusCode",
    "UnknownDigestTypeError", "V3_STATUS", "WriteLacRequest", "WriteLacResponse", "decode_request",
    "decode_response", "encode_add_acks", "encode_add_responses", "encode_error_response", "encode_header",
    "encode_request", "encode_response", "error_response_for", "keys_equal", "master_key", "parse_digest_type", "split_header",
]
