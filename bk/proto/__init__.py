"""Sans-I/O BookKeeper wire protocol: constants, messages, codec, framing, digests.

No sockets and no asyncio here: the server and client adapters feed bytes in and
write the bytes these functions return. See /work/shared/docs/PROTOCOL.md and
docs/PROTOCOL-EXTENSIONS.md (READ_LAC, WRITE_LAC, GET_BOOKIE_INFO layouts).

The byte layouts are bk/formats/wire.py's. The package's names are loaded on first use (PEP 562), so
importing one module does not import the codec, which loads the native kernels.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "bk.proto.codec": (
        "decode_request", "decode_response", "encode_add_acks", "encode_add_responses", "encode_error_response",
        "encode_header", "encode_request", "encode_response", "encode_response_parts", "error_response_for",
        "split_header"),
    "bk.proto.constants": (
        "DEFAULT_MAX_FRAME_SIZE_BYTES", "FLAG_DO_FENCING", "FLAG_HIGH_PRIORITY", "FLAG_RECOVERY_ADD",
        "PROTOCOL_VERSION", "V3_STATUS", "OpCode", "StatusCode"),
    "bk.proto.digest": ("DigestManager", "DigestType", "UnknownDigestTypeError", "parse_digest_type"),
    "bk.proto.framing": ("FrameDecoder",),
    "bk.proto.masterkey": ("keys_equal", "master_key"),
    "bk.proto.messages": (
        "AddRequest", "AddResponse", "AuthRequest", "AuthResponse", "BadFrameLengthError", "BatchReadRequest",
        "BatchReadResponse", "GetBookieInfoRequest", "GetBookieInfoResponse", "MessageEncodeError",
        "ReadLacRequest", "ReadLacResponse", "ReadRequest", "ReadResponse", "RequestDecodeError",
        "RequestVersionError", "ResponseDecodeError", "WriteLacRequest", "WriteLacResponse"),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str):
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'bk.proto' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_HOME))
