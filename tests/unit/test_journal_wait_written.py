"""Journal.wait_written never returns before the records queued at its call are written,
even when the writer takes them from the queue between its two reads (the writer counts
`_taken` up BEFORE it empties the queue, so the barrier must read the queue first; read in
the other order it missed the batch being taken, and a deleted ledger's master-key record
could still be unwritten when its deletion's checkpoint read the journal marks)."""
import threading

from bk.journal import Journal
from bk.journal.journal import FIELDS

from tests.unit.test_journal import make_config


class _TakenByTheWriter(list):
    """A queue the writer empties the moment its length is read (as the writer does:
    _taken counted first, then the records taken). `old_length`: the reader got the
    length from before the take (the batch is then counted twice), else from after
    (the interleaving 'reader reads _taken, writer takes, reader reads the length')."""

    def __init__(self, journal: Journal, records: int, old_length: bool):
        super().__init__([b"body", None, None] * records)
        self.journal = journal
        self.old_length = old_length

    def __len__(self) -> int:
        n = list.__len__(self)
        if n:
            self.journal._taken += n // FIELDS
            del self[:n]
        return n if self.old_length else list.__len__(self)


def test_a_batch_taken_during_the_call_is_waited_for(tmp_path):
    j = Journal(str(tmp_path / "journal"), make_config())
    stop = threading.Event()
    writer = threading.Thread(target=stop.wait, daemon=True)  # alive, writes nothing
    writer.start()
    try:
        j._thread = writer
        j._queue = _TakenByTheWriter(j, 3, old_length=False)
        # the three records are taken but not written: the barrier must not pass
        assert j.wait_written(0.05) is False
        j._processed += 3  # the writer wrote them
        assert j.wait_written(0.05) is True
    finally:
        stop.set()
        writer.join()


def test_a_batch_counted_twice_does_not_hold_a_quiet_journal(tmp_path):
    j = Journal(str(tmp_path / "journal"), make_config())
    stop = threading.Event()
    writer = threading.Thread(target=stop.wait, daemon=True)
    writer.start()
    try:
        j._thread = writer
        j._queue = _TakenByTheWriter(j, 3, old_length=True)
        j._processed = 3  # written by the time the barrier looks
        assert j.wait_written(5.0) is True  # nothing else will ever be queued
    finally:
        stop.set()
        writer.join()
