"""Progress displays for long shell commands, on tqdm (one well-kept, dependency-free library).

    with progress_bar(total=n, desc="ledgers", unit="ledger", quiet=args.json) as bar:
        bar.update_to(done, postfix="12.3 MB copied")
        bar.note("ledger 7: recovered")    # a line above the bar (stdout), or alone without a terminal

On a terminal the bar goes to stderr and redraws in place; without one (a pipe, a log)
there is no bar, and `note` prints plain lines to stdout; quiet (--json) shows nothing.
"""
from __future__ import annotations

import sys

from tqdm import tqdm


class ProgressBar:
    def __init__(self, total: int | None, desc: str, unit: str, quiet: bool):
        self.quiet = quiet
        self.tty = not quiet and sys.stderr.isatty()
        self._bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
                         mininterval=0.1, leave=True) if self.tty else None

    def update_to(self, done: int, total: int | None = None, postfix: str | None = None) -> None:
        bar = self._bar
        if bar is None:
            return
        if total is not None and total != bar.total:
            bar.total = total
        bar.n = done
        if postfix is not None:
            bar.set_postfix_str(postfix, refresh=False)
        bar.refresh()

    def note(self, line: str) -> None:
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress_bar(total: int | None = None, desc: str = "", unit: str = "it", quiet: bool = False) -> ProgressBar:
    return ProgressBar(total, desc, unit, quiet)
