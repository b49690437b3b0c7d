"""ExplicitLacFlusher (BookKeeper's ExplicitLacFlushPolicy): WRITE_LAC only from an idle writer
whose LAC moved past the last one sent, to every ensemble bookie that has not failed; never
while adds flow; stops once the handle refuses adds."""
import asyncio
from types import SimpleNamespace

from bk.client.explicit_lac import ExplicitLacFlusher
from bk.proto import DigestManager

D = DigestManager(3, "CRC32C", b"pw")


class Client:
    def __init__(self, sent, bookie):
        self.sent, self.bookie = sent, bookie

    def send_write_lac(self, ledger_id, master_key, lac, lac_buf, callback):
        self.sent.append((self.bookie, lac, D.verify_lac(lac_buf)))
        callback(SimpleNamespace(rc=0), None)


def handle(sent):
    pool = SimpleNamespace(get=lambda b: Client(sent, b))
    return SimpleNamespace(_loop=asyncio.get_running_loop(), last_add_pushed=-1, last_add_confirmed=-1,
                           _core=SimpleNamespace(refuse=None, failed_bookies=set()),
                           _bk=SimpleNamespace(closed=False, pool=pool), ensemble=("a", "b", "c"),
                           ledger_id=3, _digest=D, _master_key=b"k" * 20)


def test_sends_only_when_idle_and_the_lac_moved():
    async def main():
        sent = []
        lh = handle(sent)
        f = ExplicitLacFlusher(lh, 60_000)  # checks driven by hand below
        f._check()
        assert sent == []  # nothing written yet
        lh.last_add_pushed, lh.last_add_confirmed = 4, 3
        f._check()
        assert sent == []  # adds flowed since the last check: their piggybacked LACs tell readers
        lh.last_add_confirmed = 4
        f._check()  # idle for a whole interval, LAC 4 never piggybacked
        assert sent == [("a", 4, 4), ("b", 4, 4), ("c", 4, 4)]
        f._check()
        assert len(sent) == 3  # nothing new: not sent again
        lh.last_add_pushed, lh.last_add_confirmed = 5, 5
        lh._core.failed_bookies.add("b")
        f._check()
        f._check()
        assert sent[3:] == [("a", 5, 5), ("c", 5, 5)]  # a failed bookie is skipped
        lh._core.refuse = True  # closing / closed / fenced
        lh.last_add_confirmed = 6
        f._check()
        assert len(sent) == 5 and f._timer is None
        f.stop()
    asyncio.run(main())
