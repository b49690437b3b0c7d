"""`bk standalone`: a local ZooKeeper and N bookies for development.

Everything lives under --data-dir (default ./data/standalone); running it again
reuses the same ZooKeeper data and bookie directories, so ledgers survive a
restart. Ctrl-C (or SIGTERM) stops the bookies, then ZooKeeper: each bookie has
--shutdown-timeout-ms to stop (its shutdown_timeout_ms); one still running a few seconds
after that is killed. Exit 0 when every bookie stopped clean, 3 when one did not (its
unclean-shutdown flag stays set; see its log), 4 on a second Ctrl-C/SIGTERM (everything
is killed at once).

AutoRecovery runs inside every bookie (autorecovery_enabled): one of them is
elected auditor, and a bookie that is lost for good has its ledgers
re-replicated to the others (`bk shell autorecovery --status`, `whoisauditor`,
`listunderreplicated`).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

from bk.errors import BKError

# BookKeeper's standalone ports: ZooKeeper 2181, bookies 3181, 3182, ...; HTTP admin 8180, 8181, ...
ZK_PORT, BOOKIE_PORT, HTTP_PORT = 2181, 3181, 8180
KILL_MARGIN_S = 5.0  # past the bookies' own shutdown timeout, before they are killed


def _stable_ports(data_dir: str, bookies: int, zk_port: int | None) -> tuple[int | None, dict, dict, list[str]]:
    """The well-known ports for what has none saved under data_dir yet, when they are free;
    (zk port or None for a free one, bookie ports, http ports, messages about fallbacks)."""
    import os

    from bk.testing.ports import port_is_free

    notes = []
    if zk_port is None and not os.path.exists(os.path.join(data_dir, "zookeeper.port")):
        if port_is_free(ZK_PORT):
            zk_port = ZK_PORT
        else:
            notes.append(f"port {ZK_PORT} is taken: ZooKeeper gets a free port")
    bookie_ports, http_ports = {}, {}
    for i in range(bookies):
        if os.path.exists(os.path.join(data_dir, f"bookie-{i}.toml")):
            continue  # its ports are saved there
        for wanted, table, what in ((BOOKIE_PORT + i, bookie_ports, "bookie"), (HTTP_PORT + i, http_ports, "HTTP")):
            if port_is_free(wanted):
                table[i] = wanted
            else:
                notes.append(f"port {wanted} is taken: bookie {i} gets a free {what} port")
    return zk_port, bookie_ports, http_ports, notes


def add_parser(sub) -> None:
    p = sub.add_parser("standalone", help="run a local ZooKeeper and bookies", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bookies", type=int, default=3, help="number of bookies (default 3)")
    p.add_argument("--data-dir", default="data/standalone", help="where everything is kept (default data/standalone)")
    p.add_argument("--zk-port", type=int, default=None,
                   help=f"ZooKeeper client port (default {ZK_PORT} when free, else a free one; kept across restarts)")
    p.add_argument("--shutdown-timeout-ms", type=int, default=30_000,
                   help="each bookie's shutdown_timeout_ms (default 30000); one still running a few seconds"
                        " after it is killed")
    p.set_defaults(func=run)


def _kill_everything(cluster) -> None:
    """A second signal: SIGKILL every bookie and ZooKeeper (no process is left behind)."""
    for b in cluster.bookies.values():
        if b.alive:
            try:
                os.kill(b.proc.pid, signal.SIGKILL)
            except OSError:
                pass
    zk = cluster.zk
    if zk is not None and zk.pid is not None:
        try:
            os.kill(zk.pid, signal.SIGKILL)
        except OSError:
            pass


def _stop_cluster(cluster, timeout_s: float) -> int:
    """SIGTERM every bookie, wait for them (each has `timeout_s` by its own setting), kill
    those still running KILL_MARGIN_S later, then stop ZooKeeper. EXIT_CLEAN only when every
    bookie exited 0 (bk.cli.stopping)."""
    from .stopping import EXIT_CLEAN, EXIT_UNCLEAN

    status = EXIT_CLEAN
    for b in cluster.bookies.values():
        b.signal(signal.SIGCONT)
        b.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s + KILL_MARGIN_S
    for b in cluster.bookies.values():
        if b.proc is None:
            continue
        try:
            code = b.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"bookie {b.bookie_id} still running {timeout_s + KILL_MARGIN_S:.0f} s after SIGTERM: killed;"
                  f" its unclean-shutdown flag stays set (see {b.log_path})", file=sys.stderr, flush=True)
            b.kill()
            code = b.proc.returncode
        if code != 0:
            status = EXIT_UNCLEAN
            print(f"bookie {b.bookie_id} did not stop cleanly (exit {code}); see {b.log_path}", file=sys.stderr,
                  flush=True)
    cluster.stop()  # the bookies are gone: this stops ZooKeeper
    return status


def run(args) -> int:
    from bk.testing.cluster import LocalCluster
    from bk.testing.zookeeper import ZooKeeperLaunchError

    if args.bookies < 1:
        raise BKError("--bookies must be at least 1")
    if args.shutdown_timeout_ms < 100:
        raise BKError("--shutdown-timeout-ms must be at least 100")
    stop = threading.Event()
    cluster = None

    def on_signal(signum, _frame) -> None:
        if stop.is_set():  # the second one: everything goes at once
            from .stopping import EXIT_FORCED, exit_now
            print(f"bk standalone: second {signal.Signals(signum).name}: killing the bookies and ZooKeeper",
                  file=sys.stderr, flush=True)
            if cluster is not None:
                _kill_everything(cluster)
            exit_now(EXIT_FORCED)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    zk_port, bookie_ports, http_ports, notes = _stable_ports(os.path.abspath(args.data_dir), args.bookies,
                                                             args.zk_port)
    for note in notes:
        print(f"bk standalone: {note}", file=sys.stderr)
    cluster = LocalCluster(args.data_dir, bookies=args.bookies, zk_port=zk_port, autorecovery=True,
                           bookie_ports=bookie_ports, http_ports=http_ports,
                           shutdown_timeout_ms=args.shutdown_timeout_ms)
    print(f"starting ZooKeeper and {args.bookies} bookies under {cluster.data_dir} ...", flush=True)
    try:
        cluster.start()
    except ZooKeeperLaunchError as e:
        print(f"bk standalone: {e}", file=sys.stderr)
        return 1
    uri = cluster.metadata_uri
    print(f"""
bk standalone is running.
  metadata URI : {uri}
  bookies      : {', '.join(cluster.bookie_ids)}
  HTTP admin   : {', '.join(b.http_url or '-' for b in cluster.bookies.values())}
  metrics      : {', '.join((b.http_url + '/metrics') if b.http_url else '-' for b in cluster.bookies.values())}
  logs         : {cluster.data_dir}/bookie-<i>.log, {cluster.data_dir}/zookeeper/zookeeper.log

Try it:
  bk shell --metadata-uri {uri} simpletest --ensemble {min(3, args.bookies)} --write-quorum {min(2, args.bookies)} --ack-quorum {min(2, args.bookies)}
  bk shell --metadata-uri {uri} listbookies
From Python:
  from bk.client import BookKeeper
  async with BookKeeper("{uri}") as bkc: ...

Press Ctrl-C to stop.""", flush=True)
    try:
        while not stop.wait(1.0):
            for b in cluster.bookies.values():
                if not b.alive:
                    print(f"bookie {b.bookie_id} exited ({b.proc.returncode}); see {b.log_path}", file=sys.stderr)
                    stop.set()
    finally:
        print("stopping ...", flush=True)
        status = _stop_cluster(cluster, args.shutdown_timeout_ms / 1000.0)
        print("stopped." if status == 0 else f"stopped, not cleanly (exit {status}).", flush=True)
    return status
