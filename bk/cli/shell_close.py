"""`bk shell closeledger`: BP-46's operator decision for a ledger that recovery refuses to close.

Recovery (bk.client.recovery) closes a ledger only where its bookies' answers prove the
end: when too few of them answer, or they disagree in a way no quorum decides, the ledger
stays IN_RECOVERY and every open-with-recovery fails. Then only an operator can decide,
knowing what each replica holds:

    closeledger LEDGER                          read only: each bookie of the last segment,
                                                its last entry and the LAC stamped in it
    closeledger LEDGER --at-entry N --i-accept-data-loss
                                                fence the replicas that answer, then close at N

The close is one compare-and-set write of the metadata read before the replicas were
asked: a writer or a recovery that changed it meanwhile makes the command fail (run it
again and look again), never overwrite. N may not be beyond the highest entry a replica
reported (the ledger's length comes from entry N's own header, so N must be readable),
nor before the last segment's first entry (earlier segments were closed by ensemble
changes: their entries were all acknowledged).
"""
from __future__ import annotations

import logging

from bk.errors import BKError, ConfigError

from .commands import arg, at_least, command_table

COMMANDS, command = command_table()
log = logging.getLogger("bk.shell")


async def _ask(client, ledger_id: int, digest, flags: int = 0, master_key: bytes | None = None) -> dict:
    """One bookie's last entry (READ of entry -1): {"last_entry", "lac", "length"} or {"error"}."""
    from bk.errors import NoSuchEntryError, NoSuchLedgerError, error_for_code
    try:
        kw = {"flags": flags, "master_key": master_key} if flags else {}
        resp = await client.call(client.send_read, ledger_id, -1, **kw)
    except BKError as e:
        return {"error": str(e)}
    if resp.rc in (NoSuchEntryError.code, NoSuchLedgerError.code):
        return {"last_entry": -1, "lac": -1, "length": 0, "note": "holds no entry of it"}
    if resp.rc != 0:
        return {"error": str(error_for_code(resp.rc, "read of entry -1", ledger_id=ledger_id))}
    try:
        entry_id, lac, length, _ = digest.unpack_entry(resp.body)
    except BKError as e:
        return {"error": f"its last entry does not verify: {e}"}
    return {"last_entry": entry_id, "lac": lac, "length": length}


async def _length_at(bkc, digest, md, entry_id: int) -> int:
    """The ledger length stamped in entry `entry_id` by its writer, read from any replica."""
    if entry_id < 0:
        return 0
    ensemble = md.ensemble_for(entry_id)
    replicas = [ensemble[(entry_id + i) % md.ensemble_size] for i in range(md.write_quorum_size)]
    errors = []
    for bookie in replicas:
        client = bkc.pool.get(bookie)
        try:
            resp = await client.call(client.send_read, digest.ledger_id, entry_id)
            if resp.rc == 0:
                return digest.verify_entry(entry_id, resp.body)[1]
            errors.append(f"{bookie}: rc {resp.rc}")
        except BKError as e:
            errors.append(f"{bookie}: {e}")
    raise BKError(f"no replica returned entry {entry_id} ({'; '.join(errors)}): cannot close there, its length "
                  "is unknown")


@command(
    "closeledger", help="show what each replica of an open ledger holds; close it at a chosen entry",
    description=__doc__.split("\n\n", 1)[1], raw_description=True,
    args=(arg("ledger_id", type=int, help="the ledger"),
          arg("--at-entry", type=at_least(-1), default=None, metavar="N", help="close with last entry N"),
          arg("--i-accept-data-loss", action="store_true",
              help="required with --at-entry: entries after N are given up, acknowledged or not"),
          arg("--password", default=None, help="the ledger's password (default: the one in its metadata)")))
async def cmd_closeledger(uri, args):
    from bk.client import BookKeeper
    from bk.errors import MetadataVersionError
    from bk.proto import FLAG_DO_FENCING, DigestManager, master_key

    if args.at_entry is not None and not args.i_accept_data_loss:
        raise ConfigError(f"closing at entry {args.at_entry} gives up every entry after it, even acknowledged ones: "
                          "add --i-accept-data-loss to do it")
    if args.i_accept_data_loss and args.at_entry is None:
        raise ConfigError("--i-accept-data-loss goes with --at-entry N")
    lid = args.ledger_id
    async with BookKeeper(uri) as bkc:
        md, version = await bkc.ledger_manager.read_ledger_metadata(lid)
        password = md.password if args.password is None else args.password.encode()
        if password is None:
            raise ConfigError(f"ledger {lid}'s metadata keeps no password: give --password")
        digest = DigestManager(lid, int(md.digest_type) if md.digest_type is not None else "CRC32C", password)
        first, ensemble = md.last_segment
        replicas = {b: await _ask(bkc.pool.get(b), lid, digest) for b in ensemble}
        d = {"ledger_id": lid, "state": md.state.name, "metadata_version": version, "last_segment_first_entry": first,
             "closed_last_entry": md.last_entry_id if md.is_closed else None, "replicas": replicas}
        lines = [f"ledger {lid}: {md.state.name} (metadata version {version}), E={md.ensemble_size} "
                 f"WQ={md.write_quorum_size} AQ={md.ack_quorum_size}; last segment from entry {first}"]
        for b, r in replicas.items():
            lines.append(f"  {b}: " + (f"UNREACHABLE OR FAILED: {r['error']}" if "error" in r else
                                       f"last entry {r['last_entry']}, LAC in it {r['lac']}, length {r['length']}"
                                       + (f" ({r['note']})" if "note" in r else "")))
        if md.is_closed:
            lines.append(f"closed at entry {md.last_entry_id}: nothing to decide")
        if args.at_entry is None:
            if not md.is_closed:
                lines.append("to close it: --at-entry N --i-accept-data-loss (entries after N are given up)")
            d.update(ok=True, text="\n".join(lines))
            return d
        if md.is_closed:
            raise BKError(f"ledger {lid} is already closed at entry {md.last_entry_id}")
        n = args.at_entry
        highest = max((r["last_entry"] for r in replicas.values() if "error" not in r), default=None)
        if n < first - 1:
            raise BKError(f"entry {n} is before the last segment (from entry {first}): the entries before it were "
                          f"acknowledged when the ensemble changed; the lowest end is {first - 1}")
        if highest is None or n > highest:
            raise BKError(f"no replica that answered holds entry {n} (highest: {highest}): cannot close beyond it")
        length = await _length_at(bkc, digest, md, n)
        key = master_key(password)
        fenced = {b: "error" not in await _ask(bkc.pool.get(b), lid, digest, FLAG_DO_FENCING, key) for b in ensemble}
        try:
            new_version = await bkc.ledger_manager.write_ledger_metadata(lid, md.with_closed(n, length), version)
        except MetadataVersionError:
            raise BKError(f"ledger {lid}'s metadata changed since version {version} was read (a writer or a recovery "
                          "is at work): nothing was closed; run the command again and look again") from None
    lost = (highest - n) if highest is not None else 0
    log.warning("ledger %d CLOSED BY OPERATOR at entry %d, length %d (metadata version %d -> %d); %d later entries "
                "held by some replica given up; fenced: %s", lid, n, length, version, new_version, lost,
                ", ".join(b for b, ok in fenced.items() if ok) or "none")
    lines.append(f"fenced {sum(fenced.values())} of {len(fenced)} replicas; closed ledger {lid} at entry {n}, "
                 f"length {length} (metadata version {new_version})"
                 + (f"; gave up entries {n + 1}..{highest} that some replica holds" if lost > 0 else ""))
    d.update(ok=True, state="CLOSED", closed_last_entry=n, length=length, metadata_version=new_version,
             fenced=fenced, entries_given_up=max(lost, 0), text="\n".join(lines))
    return d
