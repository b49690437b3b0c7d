"""The bookie's side of explicit LAC (BookKeeper's setExplicitLac): a WRITE_LAC raises the LAC the
bookie knows, so the long polls parked on it are answered and READ answers' maxLAC carry it; a
journal replay restores it; a buffer naming another ledger raises nothing."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from test_bookie import KEY, entry, make_config, run, started  # noqa: E402

from bk.proto import DigestManager  # noqa: E402
from bk.testing.powerloss import halt_without_checkpoint  # noqa: E402


def lac_buf(ledger_id: int, lac: int) -> bytes:
    return DigestManager(ledger_id, "CRC32C", b"pw").frame_lac(lac)


def test_write_lac_raises_the_known_lac_and_wakes_long_polls(tmp_path):
    async def main():
        b = await started(make_config(tmp_path))
        try:
            for eid in range(5):
                await b.add_entry(9, eid, entry(9, eid, lac=eid - 1), KEY)
            assert b.last_add_confirmed(9) == 3  # piggybacked on entry 4
            woken = []
            desc = b.wait_for_lac_update(9, 3, woken.append)
            assert desc is not None and woken == []
            await b.write_lac(9, KEY, lac_buf(9, 4))  # the idle writer's LAC: entry 4 is confirmed
            assert woken == [4]
            assert b.last_add_confirmed(9) == 4
            await b.write_lac(9, KEY, lac_buf(9, 2))  # an older explicit LAC never lowers it
            assert b.last_add_confirmed(9) == 4
            await b.write_lac(9, KEY, lac_buf(77, 50))  # another ledger's buffer: stored, not believed
            assert b.last_add_confirmed(9) == 4
        finally:
            await b.stop()
    run(main())


async def _restarted_after_write_lac(cfg, ledger_id: int, stop):
    """Three entries and WRITE_LAC 2 on a bookie, `stop(bookie)`, then the bookie started again."""
    b = await started(cfg)
    for eid in range(3):
        await b.add_entry(ledger_id, eid, entry(ledger_id, eid, lac=eid - 1), KEY)
    await b.write_lac(ledger_id, KEY, lac_buf(ledger_id, 2))
    await stop(b)
    return await started(cfg)


async def _halt(b) -> None:
    halt_without_checkpoint(b)


def test_explicit_lac_survives_replay(tmp_path):
    async def main():
        b = await _restarted_after_write_lac(make_config(tmp_path), 8, _halt)
        try:
            assert b.read_lac(8) == lac_buf(8, 2)
            assert b.last_add_confirmed(8) == 2
        finally:
            await b.stop()
    run(main())


def test_explicit_lac_known_after_a_clean_restart(tmp_path):
    """A clean stop checkpoints the journal, so no EXPLICIT_LAC record is replayed: the LAC the
    bookie knows must come from the stored explicit LAC, or a v3 tailing reader's long poll
    (previousLAC 1, the idle writer's WRITE_LAC said 2) waits for an add that may never come."""
    async def main():
        b = await _restarted_after_write_lac(make_config(tmp_path), 6, lambda b: b.stop())
        try:
            assert b.read_lac(6) == lac_buf(6, 2)
            assert b.last_add_confirmed(6) == 2
            assert b.wait_for_lac_update(6, 1, lambda lac: None) is None  # answered at once
        finally:
            await b.stop()
    run(main())
