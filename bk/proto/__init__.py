"""Sans-I/O BookKeeper v2 wire protocol: constants, messages, codec, framing, digests.

No sockets and no asyncio here: the server and client adapters feed bytes in and
write the bytes these functions return. See /work/shared/docs/PROTOCOL.md and
docs/PROTOCOL-EXTENSIONS.md (READ_LAC, WRITE_LAC, GET_BOOKIE_INFO layouts).

The names below load lazily (PEP 562), so `import bk.proto.constants` (pure: the
digest table, entry header sizes, which spark/ reads) never loads the native kernels
the codec and digests use.
"""
import importlib

_EXPORTS = {
    "decode_request": "codec", "decode_response": "codec", "encode_add_acks": "codec",
    "encode_add_responses": "codec", "encode_error_response": "codec", "encode_header": "codec",
    "encode_request": "codec", "encode_response": "codec", "error_response_for": "codec",
    "split_header": "codec", "DEFAULT_MAX_FRAME_SIZE_BYTES": "constants", "FLAG_DO_FENCING": "constants",
    "FLAG_HIGH_PRIORITY": "constants", "FLAG_RECOVERY_ADD": "constants", "PROTOCOL_VERSION": "constants",
    "V3_STATUS": "constants", "OpCode": "constants", "StatusCode": "constants", "DigestManager": "digest",
    "DigestType": "digest", "UnknownDigestTypeError": "digest", "parse_digest_type": "digest",
    "FrameDecoder": "framing", "keys_equal": "masterkey", "master_key": "masterkey", "AddRequest": "messages",
    "AddResponse": "messages", "AuthRequest": "messages", "AuthResponse": "messages",
    "BadFrameLengthError": "messages", "BatchReadRequest": "messages", "BatchReadResponse": "messages",
    "GetBookieInfoRequest": "messages", "GetBookieInfoResponse": "messages", "MessageEncodeError": "messages",
    "ReadLacRequest": "messages", "ReadLacResponse": "messages", "ReadRequest": "messages",
    "ReadResponse": "messages", "RequestDecodeError": "messages", "RequestVersionError": "messages",
    "ResponseDecodeError": "messages", "WriteLacRequest": "messages", "WriteLacResponse": "messages",
}

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


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        if name in ("codec", "constants", "digest", "framing", "masterkey", "messages"):
            return importlib.import_module(f"bk.proto.{name}")
        raise AttributeError(f"module 'bk.proto' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"bk.proto.{module}"), name)
    globals()[name] = value
    return value
