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


def add_parser(sub) -> None:
    p = sub.add_parser("standalone", help="run a local ZooKeeper and bookies", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bookies", type=int, default=3, help="number of bookies (default 3)")
    p.add_argument("--data-dir", default="data/standalone", help="where everything is kept (default data/standalone)")
    p.add_argument("--zk-port", type=int, default=None, help="ZooKeeper client port (default: a free one)")
    p.set_defaults(func=run)


def run(args) -> int:
    from bk.testing.cluster import LocalCluster
    from bk.testing.zookeeper import ZooKeeperLaunchError

    if args.bookies < 1:
        raise BKError("--bookies must be at least 1")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    cluster = LocalCluster(args.data_dir, bookies=args.bookies, zk_port=args.zk_port, autorecovery=True)
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
