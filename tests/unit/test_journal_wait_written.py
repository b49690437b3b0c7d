"""Journal.wait_written never returns before the records queued at its call are written,
even when the writer takes them from the queue between its two reads (the writer counts
`_taken` up BEFORE it empties the queue, so the barrier must read the queue first; read in
the other order it missed the batch being taken, and a deleted ledger's master-key record
could still be unwritten when its deletion's checkpoint read the journal marks)."""
import threading

from bk.journal import Journal
from bk.journal.journal import FIELDS

from tests.unit.test_journal import make_config


class _TakenWhileMeasured(list):
    """A queue the writer empties the moment its length is read: the interleaving
    'reader reads _taken, writer takes the batch, reader reads the queue length'."""

    def __init__(self, journal: Journal, records: int):
        super().__init__([b"body", None, None] * records)
        self.journal = journal

    def __len__(self) -> int:
        n = list.__len__(self)
        if n:
            self.journal._taken += n // FIELDS  # as the writer: count first, then take
            del self[:n]
        return list.__len__(self)


def test_a_batch_taken_during_the_call_is_waited_for(tmp_path):
    j = Journal(str(tmp_path / "journal"), make_config())
    stop = threading.Event()
    writer = threading.Thread(target=stop.wait, daemon=True)  # alive, writes nothing
    writer.start()
    try:
        j._thread = writer
        j._queue = _TakenWhileMeasured(j, 3)
        # the three records are taken but not written: the barrier must not pass
        assert j.wait_written(0.05) is False
        j._processed += 3  # the writer wrote them
        assert j.wait_written(0.05) is True
    finally:
        stop.set()
        writer.join()


class _TakenAfterMeasured(list):
    """The other interleaving: the length is read, then the writer takes the batch before
    the barrier reads `_taken` (the batch is counted twice)."""

    def __init__(self, journal: Journal, records: int):
        super().__init__([b"body", None, None] * records)
        self.journal = journal

    def __len__(self) -> int:
        n = list.__len__(self)
        if n:
            self.journal._taken += n // FIELDS
            del self[:n]
        return n


def test_a_batch_counted_twice_does_not_hold_a_quiet_journal(tmp_path):
    j = Journal(str(tmp_path / "journal"), make_config())
    stop = threading.Event()
    writer = threading.Thread(target=stop.wait, daemon=True)
    writer.start()
    try:
        j._thread = writer
        q = _TakenAfterMeasured(j, 3)
        j._queue = q
        j._processed = 3  # written by the time the barrier looks
        assert j.wait_written(5.0) is True  # nothing else will ever be queued
    finally:
        stop.set()
        writer.join()
