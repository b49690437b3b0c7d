"""What BookieConnection writes to its socket without the transport (bk.server.connection):
answers of at least DIRECT_WRITE_MIN_BYTES go out by os.writev / os.sendfile, the GIL
released, and what the socket did not take goes to the transport, in order; spans of entry
logs (bk.entrylog.spans) are read or copied for the transport, and always released.
"""
from __future__ import annotations

import os

from bk.entrylog.spans import BufferSpan, FileSpan
from bk.fileio import IOV_MAX


def _plain_socket_fd(transport) -> int:
    """The fd a plain TCP transport writes to, or -1 (TLS, a test's fake transport)."""
    if transport.get_extra_info("sslcontext") is not None or transport.get_extra_info("ssl_object") is not None:
        return -1
    sock = transport.get_extra_info("socket")
    try:
        return sock.fileno() if sock is not None else -1
    except (AttributeError, OSError):
        return -1


def _write_direct(fd: int, out: list) -> list:
    """Write what the non-blocking socket takes now, the GIL released: runs of buffers (and
    BufferSpans) by os.writev, FileSpans by os.sendfile; return the rest (a span cut short is
    advanced past what was sent, one sent whole is released). Any error leaves the rest to the transport,
    whose own write meets a socket error again and closes the connection the usual way (a
    span's read error is met by _read_spans)."""
    i, n_out = 0, len(out)
    while i < n_out:
        part = out[i]
        if type(part) is FileSpan:
            try:
                n = os.sendfile(fd, part.fd, part.offset, part.length)
            except OSError:  # BlockingIOError (a full socket) included
                return out[i:]
            part.advance(n)
            if part.length:
                return out[i:]
            part.release()
            i += 1
            continue
        j = i + 1
        while j < n_out and j - i < IOV_MAX and type(out[j]) is not FileSpan:
            j += 1
        run = out[i:j]
        try:
            n = os.writev(fd, [p.view if type(p) is BufferSpan else p for p in run])
        except OSError:
            return out[i:]
        rest = unwritten(run, n)
        if rest:
            return rest + out[j:]
        i = j
    return []


def _copy_buffer_spans(out: list) -> list:
    """`out` with what is left of its BufferSpans copied (the transport may keep what it is
    given; the buffers go back to their pool)."""
    copied = [part.read() if type(part) is BufferSpan else part for part in out]
    for part in out:
        if type(part) is BufferSpan:
            part.release()
    return copied


def _read_spans(out: list) -> list:
    """`out` with its FileSpans read into bytes (a thread: they may be on disk); every span
    is released, read or not."""
    try:
        return [part.read() if type(part) is FileSpan else part for part in out]
    finally:
        _release_spans(out)


def _release_spans(parts: list) -> None:
    for part in parts:
        if type(part) in _SPANS:
            part.release()


_SPANS = (FileSpan, BufferSpan)


def unwritten(out: list, n: int) -> list:
    """The parts of `out` left after its first n bytes were written: the first cut as a view (a
    BufferSpan advanced); the BufferSpans written whole are released."""
    i = 0
    while i < len(out):
        size = len(out[i])
        if n < size:
            break
        n -= size
        if type(out[i]) is BufferSpan:
            out[i].release()
        i += 1
    rest = out[i:]
    if rest and n:
        if type(rest[0]) is BufferSpan:
            rest[0].advance(n)
        else:
            rest[0] = memoryview(rest[0])[n:]
    return rest
