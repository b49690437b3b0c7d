"""The client side of a chaos run (issue 28): each client's wire protocol and TLS, and the
client faults: a writer killed mid-add, a writer cut off from some bookies only, and two
clients racing to recover a ledger while its writer writes.

All of it is injected from here into ordinary `BookKeeper` clients (nothing in bk/client knows):
- `client_options(chaos, role)`: the keyword arguments of one client of the run: the short
  timeouts, the protocol the scenario drew for that role (v2 or v3, `Scenario.protocol`), and
  with TLS the run's CA as trust store (hostname verification on: the bookies' certificate
  names 127.0.0.1 and 127.0.0.2). Every client records its protocol in `chaos.protocols`.
- `tls_config(work_dir)`: a CA and one bookie certificate, and the bookie settings that serve
  TLS with them (START_TLS; a client certificate is optional: the bookies' own clients,
  AutoRecovery's, present theirs and trust the same CA). The fault proxies are TCP proxies: a TLS
  stream is no frames to them, so it passes through raw (rules that match a frame's content,
  drop adds say, then match nothing; blackholes, pauses and resets act as before).
- `route_client`: a writer that a client-partition fault targets reaches every bookie through a
  private proxy of its own (the pool's `resolve`), in front of the cluster's; the fault blackholes
  the private proxy of one bookie, so that writer alone cannot reach it while the other clients
  and the checker can.
- `CrashableHandle`: what History.add sees of a writer's handle. `writer-crash` is a kill -9 of
  the writer's process: at one instant, with no await, every connection of its client is aborted
  (bytes not yet written are discarded, never flushed), its pool and metadata session go, and
  every add in flight is recorded as of unknown outcome (a dead process learns nothing more; the
  client's own later verdicts are ignored). Some of those adds reached some bookies only: the
  recovery at the end must settle each one way or the other, and the invariants still hold.
"""
from __future__ import annotations

import asyncio
import os

from bk.errors import BKError
from bk.testing.proxy import Proxy

TLS_HOSTS = ("127.0.0.1", "127.0.0.2")


class WriterCrashed(BKError):
    """The writer's process was killed: whether its add was stored is unknown."""

    outcome_unknown = True


class WriterDead(BKError):
    """An add asked of a writer already killed: it never left (a dead process sends nothing)."""

    outcome_unknown = False


def tls_config(work_dir: str) -> tuple[dict, str]:
    """(the bookies' TLS settings, the clients' trust store): PEM files under `work_dir`."""
    from bk.testing.certs import make_ca, make_cert, write_pem
    d = os.path.join(work_dir, "tls")
    os.makedirs(d, exist_ok=True)
    ca = make_ca("chaos CA")
    key, cert = make_cert(ca, "chaos bookie", dns=("localhost",), ips=TLS_HOSTS)
    trust = write_pem(os.path.join(d, "ca.pem"), cert=ca[1])
    return (dict(tls_certificate_path=write_pem(os.path.join(d, "bookie.pem"), cert=cert),
                 tls_key_store=write_pem(os.path.join(d, "bookie.key"), key=key), tls_trust_store=trust), trust)


def client_options(chaos, role: str, **extra) -> dict:
    """The kwargs of the run's client `role` (see the module docstring)."""
    from .run import CLIENT_TIMEOUTS
    protocol = chaos.s.protocol(role)
    chaos.protocols[role] = protocol
    options = dict(CLIENT_TIMEOUTS, protocol=protocol, **extra)
    if chaos.tls_trust_store:
        options["tls_trust_store"] = chaos.tls_trust_store
    return options


def targeted(chaos, kind: str, plan_index: int) -> list:
    return [f for f in chaos.s.active_faults if f.kind == kind and chaos.s.client_target(f) == plan_index]


async def route_client(chaos, bkc, plan_index: int) -> None:
    """Route writer `plan_index`'s connections through private proxies when a client-partition
    fault targets it (before the client's first connection: the pool resolves each bookie once)."""
    if not targeted(chaos, "client-partition", plan_index):
        return
    cluster, routes = chaos.cluster, {}
    for i in range(cluster.count):
        host, _, port = cluster.bookie_id(i).rpartition(":")
        routes[cluster.bookie_id(i)] = await Proxy(host, int(port), host, 0).start()
    chaos.routes[plan_index] = routes

    def resolve(bookie_id: str) -> tuple[str, int]:
        proxy = routes.get(bookie_id)
        if proxy is not None:
            return proxy.listen_host, proxy.port
        host, _, port = bookie_id.rpartition(":")
        return host, int(port)
    bkc.pool._resolve = resolve
    chaos.note(f"writer {plan_index} reaches the bookies through routes of its own")


async def stop_routes(chaos) -> None:
    for routes in chaos.routes.values():
        for proxy in routes.values():
            await proxy.stop()


class CrashableHandle:
    """A writer's LedgerHandle as History.add sees it, until the writer is killed (`crash`)."""

    def __init__(self, lh, bkc):
        self.lh, self.bkc, self.ledger_id = lh, bkc, lh.ledger_id
        self.crashed = False
        self._in_flight: set[asyncio.Future] = set()

    def add_entry(self, data) -> asyncio.Future:
        outer = asyncio.get_running_loop().create_future()
        if self.crashed:
            outer.set_exception(WriterDead(f"ledger {self.ledger_id}: the writer was killed before this add"))
            return outer
        inner = self.lh.add_entry(data)
        self._in_flight.add(outer)

        def done(f) -> None:
            self._in_flight.discard(outer)
            err = None if f.cancelled() else f.exception()  # retrieved: a dead writer's verdict is ignored
            if outer.done():
                return
            if f.cancelled():
                outer.cancel()
            elif err is not None:
                outer.set_exception(err)
            else:
                outer.set_result(f.result())
        inner.add_done_callback(done)
        return outer

    def crash(self) -> int:
        """kill -9: abort every connection (nothing buffered is sent), then drop the client. No
        await here: nothing of the writer runs between the first abort and the last verdict."""
        self.crashed = True
        # a closed client is what the handle asks before it changes an ensemble or writes metadata
        # (LedgerHandle._bookie_failed): set first, so the losses the aborts report change nothing
        self.bkc._closed = True
        aborted = 0
        for client in self.bkc.pool.clients().values():
            for c in (client, client._side_client, client._long_poll_client):
                protocol = None if c is None else c._core.protocol
                if protocol is not None and protocol.transport is not None:
                    protocol.transport.abort()
                    aborted += 1
        for outer in list(self._in_flight):
            if not outer.done():
                outer.set_exception(WriterCrashed(f"ledger {self.ledger_id}: the writer was killed mid-add"))
        self._in_flight.clear()
        self.bkc.pool.close()  # no reconnect
        asyncio.ensure_future(_end_session(self.bkc))
        return aborted


async def _end_session(bkc) -> None:
    """The rest of BookKeeper.close (which returns at once for a client already marked closed):
    the dead process's metadata session goes."""
    if bkc.registration is not None:
        await bkc.registration.close()
    if bkc.store is not None:
        await bkc.store.close()


# ------------------------------------------------------------ the nemesis kinds (group "client")
async def _writer_ready(ctx, ready) -> None:
    """A client fault's clock runs from the start of the run, but its writer may still be
    connecting (a loaded machine, TLS): it acts once `ready()`, unless every writer is done."""
    while not ready() and not (ctx.writing is not None and ctx.writing.done()):
        await asyncio.sleep(0.005)


async def writer_crash(ctx, fault) -> str:
    k = ctx.s.client_target(fault)
    await _writer_ready(ctx, lambda: k in ctx.crashables)
    handle = ctx.crashables.get(k)
    if handle is None or handle.crashed:
        return f"writer {k} has no open ledger to crash"
    if handle.lh.is_closed:
        return f"writer {k} already closed its ledger"
    in_flight = len(handle._in_flight)
    ctx.crashed_writers.add(k)
    aborted = handle.crash()
    return f"writer {k} killed with {in_flight} adds in flight, {aborted} connections aborted"


async def client_partition(ctx, fault) -> str:
    k = ctx.s.client_target(fault)
    await _writer_ready(ctx, lambda: k in ctx.routes)
    proxy = ctx.routes.get(k, {}).get(ctx.cluster.bookie_id(fault.bookie))
    if proxy is None:
        return f"writer {k} has no route to bookie {fault.bookie} (not started)"
    proxy.set_blackhole(True)
    return f"writer {k} alone cut off from bookie {fault.bookie} (its own route blackholed)"


async def client_heal(ctx, fault) -> None:
    proxy = ctx.routes.get(ctx.s.client_target(fault), {}).get(ctx.cluster.bookie_id(fault.bookie))
    if proxy is not None:
        proxy.set_blackhole(False)


async def recover_race(ctx, fault) -> str:
    k = ctx.s.client_target(fault)
    await _writer_ready(ctx, lambda: k in ctx.ledgers)
    if k not in ctx.ledgers:
        return f"ledger {k} not created yet: no race"
    for side in "ab":
        ctx.start_recoverer(k, f"fault {fault.index} racer {side}", exact=True)
    return f"two clients race to recover ledger {ctx.ledgers[k]} while its writer writes"


__all__ = ["CrashableHandle", "WriterCrashed", "client_options", "route_client", "stop_routes", "tls_config"]
