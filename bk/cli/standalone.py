"""`bk standalone`: a local ZooKeeper and N bookies for development.

Everything lives under --data-dir (default ./data/standalone); running it again
reuses the same ZooKeeper data and bookie directories, so ledgers survive a
restart. Ctrl-C (or SIGTERM) stops the bookies cleanly, then ZooKeeper.

AutoRecovery runs inside every bookie (autorecovery_enabled): one of them is
elected auditor, and a bookie that is lost for good has its ledgers
re-replicated to the others (`bk shell autorecovery --status`, `whoisauditor`,
`listunderreplicated`).
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading

from bk.errors import BKError

# BookKeeper's standalone ports: ZooKeeper 2181, bookies 3181, 3182, ...; HTTP admin 8180, 8181, ...
ZK_PORT, BOOKIE_PORT, HTTP_PORT = 2181, 3181, 8180


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
    p.set_defaults(func=run)


def run(args) -> int:
    from bk.testing.cluster import LocalCluster
    from bk.testing.zookeeper import ZooKeeperLaunchError

    if args.bookies < 1:
        raise BKError("--bookies must be at least 1")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    import os

    zk_port, bookie_ports, http_ports, notes = _stable_ports(os.path.abspath(args.data_dir), args.bookies,
                                                             args.zk_port)
    for note in notes:
        print(f"bk standalone: {note}", file=sys.stderr)
    cluster = LocalCluster(args.data_dir, bookies=args.bookies, zk_port=zk_port, autorecovery=True,
                           bookie_ports=bookie_ports, http_ports=http_ports)
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
        cluster.stop()
        print("stopped.", flush=True)
    return 0
