"""A stand-in asyncio transport for driving a BookieConnection in process (no socket): what
the connection writes piles up in `out`; `buffered` is what a client that does not read
would leave unwritten; `closing` is set by close()/abort()."""
from __future__ import annotations


class FakeTransport:
    def __init__(self):
        self.out: list[bytes] = []
        self.paused = False
        self.closing = False
        self.buffered = 0

    def write(self, data) -> None:
        self.out.append(bytes(data))

    def writelines(self, parts) -> None:
        self.out.append(b"".join(parts))

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_extra_info(self, name):
        return None

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    abort = close
