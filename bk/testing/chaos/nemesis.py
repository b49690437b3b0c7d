"""The nemesis table: every fault kind a chaos run can inject, one entry each.

A kind is (name, weight, modes, duration range, draw, apply, heal, needs):
- weight: how often generate() picks it (0 = never, only on request);
- modes: the clusters it works on ("inprocess", "process");
- draw(rng) -> dict: its parameters, from the fault's own random stream;
- apply(ctx, fault) -> str: inject it (returns what it did, for the trace);
- heal(ctx, fault): undo it (called `duration_ms` later, or when the run heals
  everything at its end; must be idempotent and safe when apply did nothing);
- needs(journal, autorecovery) -> bool: whether it makes sense in that cluster.
Adding a kind (the disk-fault kinds, say) is adding one entry to KINDS.

`ctx` is the run's Chaos object (run.py): `cluster` (clusters.py), `mark_crashed`,
`mark_flipped` (what each may excuse, per bookie and entry: excuse.py; the checker
may then excuse a lost entry, never a "no such entry"), `corrupted`, `note(text)`,
and `start_recoverer`.

What each kind models:
- crash: kill -9 (in-process: no final checkpoint, write cache lost), restart later.
- power-loss: kill -9 and every write not fsynced dropped, sometimes a torn last page;
  sometimes two neighbouring bookies at once (one rack).
- power-loss-all: the whole cluster's power cut at once (a correct bookie with its
  journal on loses nothing it acknowledged even then). A cut of several bookies is one
  instant: every one stops before any file is cut (clusters.py power_cut).
- pause: longer than the client's timeouts (SIGSTOP; in-process every frame to and
  from the bookie is held and delivered late, as a stopped process would handle them).
- partition: the bookie unreachable (the proxy blackholes it); streams resume after.
- delay, drop, reorder (adds held back and delivered after later ones), reset.
- zk-expire: the bookie's metadata session expires (it must register again).
- bitflip: one bit flipped in an entry log or a journal file at rest.
- recover: a second client opens a ledger with recovery while its writer writes.
- disk-full: every write under the bookie's directories (or its journal or ledger dirs)
  finds no space, and the disk reports 100% used; healed, the bookie's disk check makes it
  writable again.
- fsync-error, write-error: an fsync or a write under the journal or the ledger dirs fails
  (EIO or ENOSPC; once, or until healed; a failed fsync also drops what it covered, as
  Linux does); healed by "replacing the disk": the rule goes, the bookie is killed and
  started again (a storage failure ends only with a restart).
- writer-crash, client-partition, recover-race (the client group, clients.py): a writer killed
  mid-add (kill -9 of its process: connections aborted, nothing flushed); one writer alone cut off
  from one bookie through a route of its own; two clients recovering a ledger at once.
"""
from __future__ import annotations

import errno
import glob
import os
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from bk.testing.proxy import DOWN, UP, Rule, add_request, fencing_read, read_request

from . import clients
from .clusters import BookieStartError
from .excuse import entry_at
from .scenario import INPROCESS, PROCESS

BOTH_MODES = frozenset({INPROCESS, PROCESS})


@dataclass(frozen=True)
class NemesisKind:
    name: str
    weight: float
    apply: Callable[..., Awaitable[str]]
    heal: Callable[..., Awaitable[None]]
    duration_ms: tuple[int, int] = (100, 800)
    draw: Callable | None = None
    modes: frozenset = BOTH_MODES
    needs: Callable[[bool, bool], bool] | None = None
    # "core" kinds share one draw; a later group (disk faults) is drawn from its own stream and
    # appended, so adding a group leaves every seed's earlier schedule exactly as it was
    group: str = "core"


async def _nothing(ctx, fault) -> None:
    return None


async def _restart(ctx, fault) -> None:
    await ctx.restart(fault.bookie)


# -------------------------------------------------------------- crashes
async def _crash(ctx, fault) -> str:
    i = fault.bookie
    if not ctx.cluster.alive(i):
        return f"bookie {i} already down"
    # dated when the bookie stopped, not when the kill was asked for: it waits for the bookie's
    # lock (and, for a process, a thread), and what the bookie acknowledged meanwhile was sent
    # after the asking but lost all the same (seed 190140)
    asked = time.monotonic()
    stopped_at = await ctx.cluster.crash(i)
    if stopped_at is None:
        return f"bookie {i} already down"
    ctx.mark_crashed(i, stopped_at)
    return f"kill -9 bookie {i} ({(stopped_at - asked) * 1000:.0f} ms after it was asked for)"


async def _power_loss(ctx, fault) -> str:
    """`bookies` = 2: this bookie and the next one lose power together (a rack)."""
    n = ctx.cluster.count
    victims = [(fault.bookie + k) % n for k in range(fault.param("bookies", 1))]
    return "power loss of bookie(s) " + await _power_cut(ctx, fault, victims)


async def _power_cut(ctx, fault, victims: list[int]) -> str:
    """One instant for all `victims` (clusters.py power_cut): every running one stops before
    any file is cut, so no write can land on one of them between two bookies' cuts."""
    def stopped_now(stopped: list[int]) -> None:
        for i in stopped:
            ctx.mark_crashed(i)

    stopped, report = await ctx.cluster.power_cut(victims, fault.param("tear", False), ctx.fault_rng(fault),
                                                  on_instant=stopped_now)
    return f"{victims}, at one instant (running then: {stopped}): {report}"


async def _restart_victims(ctx, fault) -> None:
    for k in range(fault.param("bookies", 1)):
        await ctx.restart((fault.bookie + k) % ctx.cluster.count)


async def _power_loss_all(ctx, fault) -> str:
    return "power loss of the whole cluster " + await _power_cut(ctx, fault, list(range(ctx.cluster.count)))


async def _restart_all(ctx, fault) -> None:
    for i in range(ctx.cluster.count):
        await ctx.restart(i)


# -------------------------------------------------------------- network
async def _pause(ctx, fault) -> str:
    if not ctx.cluster.alive(fault.bookie):
        return f"bookie {fault.bookie} down, nothing to pause"
    await ctx.cluster.pause(fault.bookie)
    return f"pause bookie {fault.bookie}"


async def _resume(ctx, fault) -> None:
    await ctx.cluster.resume(fault.bookie)


async def _partition(ctx, fault) -> str:
    ctx.cluster.proxy(fault.bookie).set_blackhole(True)
    return f"partition bookie {fault.bookie} (blackhole)"


async def _unpartition(ctx, fault) -> None:
    ctx.cluster.proxy(fault.bookie).set_blackhole(False)


def _add_rule(ctx, fault, rule: Rule) -> None:
    ctx.cluster.proxy(fault.bookie).add_rule(rule)
    ctx.rules[fault.index] = rule


async def _remove_rule(ctx, fault) -> None:
    rule = ctx.rules.pop(fault.index, None)
    if rule is not None:
        proxy = ctx.cluster.proxy(fault.bookie)
        try:
            proxy.remove_rule(rule)
        except ValueError:
            pass  # a `once` rule removes itself
        if rule.action == "hold":
            proxy.release_held()


async def _delay(ctx, fault) -> str:
    _add_rule(ctx, fault, Rule(fault.param("direction"), None, "delay", delay_s=fault.param("delay_ms") / 1000))
    return f"delay {fault.param('direction')} {fault.param('delay_ms')}ms at bookie {fault.bookie}"


_DROP_MATCH = {"adds": lambda: add_request(), "reads": lambda: read_request(), "fencing": lambda: fencing_read(),
               "all": lambda: None}


async def _drop(ctx, fault) -> str:
    what, direction = fault.param("what"), fault.param("direction")
    _add_rule(ctx, fault, Rule(direction, _DROP_MATCH[what](), "drop", once=fault.param("once")))
    return f"drop {what} {direction} at bookie {fault.bookie}{' once' if fault.param('once') else ''}"


async def _reorder(ctx, fault) -> str:
    _add_rule(ctx, fault, Rule(UP, add_request(), "hold"))
    return f"hold adds to bookie {fault.bookie} (delivered after later ones)"


async def _reset(ctx, fault) -> str:
    _add_rule(ctx, fault, Rule(fault.param("direction"), None, "reset", once=True))
    return f"reset the next connection frame {fault.param('direction')} at bookie {fault.bookie}"


# -------------------------------------------------------------- metadata, disks, clients
async def _zk_expire(ctx, fault) -> str:
    ok = await ctx.cluster.expire_session(fault.bookie)
    return f"expire the metadata session of bookie {fault.bookie}" if ok else f"bookie {fault.bookie} down"


def _flip_bit(path: str, offset: int, bit: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        if byte:
            fh.seek(offset)
            fh.write(bytes([byte[0] ^ (1 << bit)]))


async def _bitflip(ctx, fault) -> str:
    i, target = fault.bookie, fault.param("target")
    # every ledger dir: `ledgers`, or `ledgers/0`, `ledgers/1` (bk.testing.cluster.ledger_dirs_of)
    patterns = {"entrylog": [("ledgers", "current", "*.log"), ("ledgers", "*", "current", "*.log")],
                "journal": [("journal", "current", "*.txn")]}[target]
    files = sorted(p for pattern in patterns for p in glob.glob(os.path.join(ctx.cluster.data_dir_of(i), *pattern)))
    files = [(p, os.path.getsize(p)) for p in files]
    files = [(p, s) for p, s in files if s > 0]
    if not files:
        return f"no {target} file with data on bookie {i} yet"
    rng = ctx.fault_rng(fault)
    path, size = rng.choice(files)
    # journal: the first half only, so valid records follow the flip and replay calls it
    # corruption (a flip in the last record looks like a torn write, which replay may cut)
    limit = size // 2 if target == "journal" else size
    offset = rng.randrange(max(1, limit))
    bit = rng.randrange(8)
    if target == "entrylog":
        # what the flip excuses: only the entry whose record holds the byte (excuse.py), found
        # before the flip can garble a size field; a record not whole yet is found at the end
        entry = entry_at(path, offset)
        ctx.mark_flipped(i, entry, path, offset if entry is None else -1, bit)
    else:
        entry = None
        ctx.mark_corrupted(i)  # a journal flip excuses no entry: a replay meeting it refuses to start
    _flip_bit(path, offset, bit)
    return f"flip a bit of {os.path.basename(path)} ({target}) at {offset} of {size} on bookie {i}" \
           + (f" (entry {entry[1]} of ledger {entry[0]})" if entry else "")


def _disk_dir(ctx, fault) -> str:
    return os.path.join(ctx.cluster.data_dir_of(fault.bookie), fault.param("target", ""))


async def _disk_full(ctx, fault) -> str:
    ctx.add_disk_rule(fault.index, fault.bookie, ctx.cluster.disk_faults.full_disk(_disk_dir(ctx, fault)))
    return f"disk full under {fault.param('target') or 'all'} of bookie {fault.bookie}"


async def _disk_error(ctx, fault) -> str:
    op, code = fault.param("op"), getattr(errno, fault.param("errno"))
    ctx.add_disk_rule(fault.index, fault.bookie, ctx.cluster.disk_faults.fail(
        op=op, errno=code, path_prefix=_disk_dir(ctx, fault), count=fault.param("count")))
    return f"{op} fails with {fault.param('errno')} under {fault.param('target')} of bookie {fault.bookie}" \
           f" ({fault.param('count') or 'until healed'} times)"


async def _disk_heal(ctx, fault) -> None:
    """A full disk ends by itself once there is room (the bookie's disk check)."""
    held = ctx.disk_rules.pop(fault.index, None)
    if held is not None:
        ctx.cluster.disk_faults.heal(held[1])


async def _disk_heal_restart(ctx, fault) -> None:
    """A storage failure ends only with a restart (docs/DISK-FAULTS.md): the disk is
    "replaced", the bookie killed and started again."""
    held = ctx.disk_rules.pop(fault.index, None)
    if held is None:
        return
    ctx.cluster.disk_faults.heal(held[1])
    stopped_at = await ctx.cluster.crash(fault.bookie)  # None: it was down already
    if stopped_at is not None:
        ctx.mark_crashed(fault.bookie, stopped_at)
    await ctx.restart(fault.bookie)


def _disk_error_params(op: str, codes: list[str]):
    return lambda r: {"op": op, "errno": r.choice(codes), "target": r.choice(["journal", "ledgers"]),
                      "count": r.choice([1, 1, None])}


async def _recover(ctx, fault) -> str:
    return ctx.start_recoverer(fault.param("ledger"), f"fault {fault.index}")


def _direction(rng) -> str:
    return rng.choice([UP, DOWN, "both"])


KINDS: dict[str, NemesisKind] = {k.name: k for k in (
    NemesisKind("crash", 10, _crash, _restart, (50, 700)),
    NemesisKind("power-loss", 5, _power_loss, _restart_victims, (50, 700),
                draw=lambda r: {"tear": r.random() < 0.5, "bookies": r.choice([1, 1, 2])}),
    NemesisKind("power-loss-all", 4, _power_loss_all, _restart_all, (50, 400),
                draw=lambda r: {"tear": r.random() < 0.5}),
    NemesisKind("pause", 5, _pause, _resume, (300, 900)),
    NemesisKind("partition", 5, _partition, _unpartition, (100, 900)),
    NemesisKind("delay", 4, _delay, _remove_rule, (100, 800),
                draw=lambda r: {"direction": _direction(r), "delay_ms": r.randint(5, 300)}),
    NemesisKind("drop", 5, _drop, _remove_rule, (100, 800),
                draw=lambda r: {"direction": _direction(r), "what": r.choice(list(_DROP_MATCH)),
                                "once": r.random() < 0.4}),
    NemesisKind("reorder", 4, _reorder, _remove_rule, (20, 400)),
    NemesisKind("reset", 3, _reset, _remove_rule, (50, 300), draw=lambda r: {"direction": r.choice([UP, DOWN])}),
    NemesisKind("zk-expire", 3, _zk_expire, _nothing, (0, 0)),
    NemesisKind("bitflip", 2, _bitflip, _nothing, (0, 0),
                draw=lambda r: {"target": r.choice(["entrylog", "entrylog", "journal"])}),
    NemesisKind("recover", 6, _recover, _nothing, (0, 0), draw=lambda r: {"ledger": r.randrange(3)}),
    # disk faults (bk.testing.diskfaults, from the diskfault branch; docs/DISK-FAULTS.md)
    NemesisKind("disk-full", 3, _disk_full, _disk_heal, (100, 700),
                draw=lambda r: {"target": r.choice(["", "journal", "ledgers"])}, group="disk"),
    NemesisKind("fsync-error", 3, _disk_error, _disk_heal_restart, (50, 500),
                draw=_disk_error_params("fsync", ["EIO", "EIO", "ENOSPC"]), group="disk"),
    NemesisKind("write-error", 3, _disk_error, _disk_heal_restart, (50, 500),
                draw=_disk_error_params("write", ["EIO", "ENOSPC"]), group="disk"),
    # client faults (clients.py; drawn last, from the "client" streams: scenario._client_draws)
    NemesisKind("writer-crash", 1, clients.writer_crash, _nothing, (0, 0),
                draw=lambda r: {"ledger": r.randrange(4)}, group="client"),
    NemesisKind("client-partition", 1, clients.client_partition, clients.client_heal, (300, 900),
                draw=lambda r: {"ledger": r.randrange(4)}, group="client"),
    NemesisKind("recover-race", 1, clients.recover_race, _nothing, (0, 0),
                draw=lambda r: {"ledger": r.randrange(4)}, group="client"),
)}

__all__ = ["BookieStartError", "KINDS", "NemesisKind"]
