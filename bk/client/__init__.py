"""The BookKeeper client: create, write, close, open, read and delete ledgers.

    from bk.client import BookKeeper
    async with BookKeeper("zk://127.0.0.1:2181/ledgers") as bkc:   # or await BookKeeper.connect(uri)
        lh = await bkc.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2,
                                     digest_type="CRC32C", password=b"secret")
        eid = await lh.add_entry(b"payload")
        await lh.close()
        rh = await bkc.open_ledger(lh.ledger_id, password=b"secret")
        entries = await rh.read_entries(0, rh.last_add_confirmed)

        rh = await bkc.open_ledger(ledger_id, password=b"secret", recovery=True)  # fence + close
        await bkc.delete_ledger(lh.ledger_id)

Throughput forms: `lh.add_entry(x)` is a plain future (gather wraps none in a
task), `await lh.add_entries(batch)` one future per batch, `async with
lh.writer(max_in_flight=N) as w: await w.add(x)` a bounded window, `async for e
in rh.read_entries_iter(first, last)` reads ahead, and `lh.async_add_entry(x,
callback)` is BookKeeper's callback form.

Modules: bookkeeper (BookKeeper), ledger_handle (LedgerHandle: adds, ensemble
change, close, force), ledger_handle_adv (LedgerHandleAdv: chosen entry ids), writer (LedgerWriter), read_handle (ReadHandle: a tailing
reader), read_iter (the read iterator), read_ops (entry, range and batch reads,
LAC reads), recovery (fencing and ledger recovery), quorum (write sets,
coverage, ADD framing), placement (EnsemblePlacementPolicy), bookie_client
(per-bookie connections and request matching), _core.pyx / core_py (the add
and request path cores, fields and hooks declared in _core.pxd).

Errors (bk.errors): adds that fail because the writer was fenced out
(LedgerFencedError), refused (UnauthorizedAccessError), could not replace a
failed bookie (NotEnoughBookiesError) or lost their client (LedgerClosedError)
carry `outcome_unknown`: True if the entry had been sent to a bookie (it may
or may not survive recovery), False if it certainly was not written.
"""
from bk.client.bookie_client import BookieClient, BookieClientPool
from bk.client.bookkeeper import BookKeeper
from bk.client.ledger_handle import LedgerHandle
from bk.client.ledger_handle_adv import LedgerHandleAdv
from bk.client.placement import EnsemblePlacementPolicy
from bk.client.read_handle import ReadHandle
from bk.client.read_ops import LedgerEntry
from bk.client.writer import LedgerWriter

__all__ = ["BookKeeper", "BookieClient", "BookieClientPool", "EnsemblePlacementPolicy", "LedgerEntry",
           "LedgerHandle", "LedgerHandleAdv", "LedgerWriter", "ReadHandle"]
