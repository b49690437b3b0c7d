"""How `bk bookie`, `bk autorecovery` and `bk standalone` stop, whatever ZooKeeper, peers or a
disk do (docs/OPERATIONS.md, "Stopping").

The first SIGTERM or SIGINT starts the stop and arms a deadline `shutdown_timeout_ms` away. The
stop sequence bounds every wait that depends on something outside the process (ZooKeeper,
peers) by the time left; what it could not finish it abandons and names in the log. A
watchdog thread (a daemon: it never keeps the process alive) ends the process at the deadline
whatever the stop is doing, and also if leaving the interpreter is held up afterwards (a
thread stuck in a hung fsync, a kazoo thread waiting on a dead server): nothing still running
then can make anything more durable than it already is.

A second SIGTERM or SIGINT leaves at once (EXIT_FORCED), without the final checkpoint, so the
bookie's unclean-shutdown flag stays set.

Exit statuses (documented in docs/OPERATIONS.md; 1 stays "error", 2 argparse's "usage"):
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from typing import Callable

log = logging.getLogger("bk.stop")

EXIT_CLEAN = 0  # stopped within the timeout; for a bookie: every entry durable, the flag cleared
EXIT_UNCLEAN = 3  # stopped within the timeout, not cleanly: the log says what was abandoned
EXIT_FORCED = 4  # a second SIGTERM/SIGINT: left at once, nothing more made durable

__doc__ += f"""
  {EXIT_CLEAN}  clean: for a bookie, the final checkpoint made everything durable and the
     unclean-shutdown flag is cleared (an abandoned deregistration does not count: the
     znode is ephemeral and ends with the session)
  {EXIT_UNCLEAN}  stopped within shutdown_timeout_ms but not cleanly: for a bookie the final
     checkpoint failed or was abandoned at the deadline, so the flag stays set (with the
     journal off the next boot runs BP-46 phase one); for AutoRecovery its lock or vote
     was not released (they end with the session)
  {EXIT_FORCED}  a second SIGTERM or SIGINT: left at once
"""


def exit_now(status: int) -> None:
    """Flush what the log and stdout hold, then end the process without waiting for any
    thread (os._exit): the threads left are the ones that hang."""
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001 - leaving anyway
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(status)


class StopControl:
    """The signals, the deadline and the exit status of one process's stop.

    `status()` says, when called, which status the process should leave with if it had to
    leave now (the bookie: EXIT_CLEAN only once its final checkpoint cleared the flag).
    `doing()` names the step under way, for the log line of an abandoned stop."""

    def __init__(self, what: str, timeout_ms: int, status: Callable[[], int],
                 doing: Callable[[], str] = lambda: "the stop"):
        self.what = what
        self.timeout_s = timeout_ms / 1000.0
        self.status = status
        self.doing = doing
        self.requested = asyncio.Event()
        self.signal_name: str | None = None
        self._deadline_mono: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._finished: int | None = None  # the status the stop ended with (normal exit under way)

    def install(self) -> "StopControl":
        self._loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, self._on_signal, sig)
        return self

    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if self.requested.is_set():
            log.error("%s: second %s during the stop: leaving at once (exit %d); nothing more is made durable,"
                      " the unclean-shutdown flag stays set unless it was already cleared", self.what, name,
                      EXIT_FORCED)
            exit_now(EXIT_FORCED)
        self.begin(name)

    def begin(self, why: str) -> None:
        """Start the stop (a signal, or the caller's own reason) and arm the deadline."""
        if self.requested.is_set():
            return
        self.signal_name = why
        self._deadline_mono = time.monotonic() + self.timeout_s
        self.requested.set()
        log.info("%s: stopping (%s); shutdown_timeout_ms=%d", self.what, why, int(self.timeout_s * 1000))
        threading.Thread(target=self._watchdog, name="stop-watchdog", daemon=True).start()

    def deadline(self) -> float:
        """The deadline in event-loop time; a little before the watchdog's, so that a stop
        whose bounded waits all ran out still ends by itself and says so."""
        left = self._deadline_mono - time.monotonic() if self._deadline_mono is not None else self.timeout_s
        reserve = min(1.0, self.timeout_s * 0.1)
        return asyncio.get_running_loop().time() + max(0.0, left - reserve)

    def _watchdog(self) -> None:
        while True:
            left = self._deadline_mono - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(left, 0.5))
        if self._finished is not None:
            status = self._finished
            log.error("%s: leaving the process took past shutdown_timeout_ms (threads still running: %s):"
                      " exiting now with status %d", self.what, _thread_names(), status)
        else:
            status = self.status()
            log.error("%s: not stopped within shutdown_timeout_ms=%d: abandoning %s; exiting with status %d (%s)",
                      self.what, int(self.timeout_s * 1000), self.doing(), status,
                      "clean: the unclean-shutdown flag was cleared" if status == EXIT_CLEAN else "not clean")
        exit_now(status)

    def finish(self, status: int, abandoned: list[str]) -> int:
        """The stop sequence ended before the deadline. With something abandoned, threads may
        still wait on it (a kazoo call, a hung fsync): leave without joining them."""
        if abandoned:
            log.error("%s: stopped with status %d; abandoned: %s", self.what, status, "; ".join(abandoned))
            exit_now(status)
        self._finished = status
        return status


def _thread_names() -> str:
    return ", ".join(sorted(t.name for t in threading.enumerate() if t is not threading.current_thread())) or "none"

