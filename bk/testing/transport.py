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


async def answers_written(transport: FakeTransport, decoder, n: int, parse, tries: int = 400) -> list:
    """The answer frames written to `transport` (taken out of `out`), each `parse`d, once n of
    them came (polled every 5 ms, at most `tries` times) and 20 ms more showed nothing else."""
    import asyncio
    got: list = []
    for _ in range(tries):
        await asyncio.sleep(0.005)
        got += [parse(f) for f in decoder.feed(b"".join(transport.out))]
        transport.out.clear()
        if len(got) >= n:
            break
    await asyncio.sleep(0.02)  # and nothing more comes
    got += [parse(f) for f in decoder.feed(b"".join(transport.out))]
    transport.out.clear()
    return got


async def stored_then_stopped(bookie, entries) -> None:
    """Start `bookie`, add `entries` [(ledger_id, entry_id, body, master_key)], stop it: what a
    bookie started afterwards on the same directories has only in its entry logs (cold)."""
    await bookie.start()
    try:
        for ledger_id, entry_id, body, key in entries:
            await bookie.add_entry(ledger_id, entry_id, body, key)
    finally:
        await bookie.stop()
