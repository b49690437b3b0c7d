"""`bk`: the command line.

    bk bookie --conf bookie.toml [--set key=value ...]     run one bookie
    bk autorecovery --conf bookie.toml                     run AutoRecovery next to a bookie
    bk standalone [--bookies 3] [--data-dir DIR]           local ZooKeeper + bookies
    bk shell [--metadata-uri URI] <command> ...            admin and test commands
    bk analytics gc --metadata-uri URI --out DIR ...       storage analytics on Spark
"""
from __future__ import annotations

import argparse
import sys

from bk.errors import BKError


def build_parser() -> argparse.ArgumentParser:
    from . import bookie as bookie_cmd
    from . import shell as shell_cmd
    from . import standalone as standalone_cmd

    p = argparse.ArgumentParser(prog="bk", description="bk: Apache BookKeeper's distributed log storage, in Python.",
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--log-level", default=None,
                   help="DEBUG, INFO, WARNING or ERROR, optionally per logger: INFO,bk.journal=DEBUG"
                        " (default INFO; `bk bookie` and `bk autorecovery` take log_level from their settings unless given)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    bookie_cmd.add_parser(sub)
    from . import autorecovery as autorecovery_cmd
    autorecovery_cmd.add_parser(sub)
    standalone_cmd.add_parser(sub)
    shell_cmd.add_parser(sub)
    from . import analytics as analytics_cmd
    analytics_cmd.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        from .logs import setup_logging
        setup_logging(args.log_level or "INFO")
        return args.func(args) or 0
    except BKError as e:
        print(f"bk {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
