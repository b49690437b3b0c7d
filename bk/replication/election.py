"""AuditorElector: exactly one Auditor in the cluster, chosen by ephemeral-sequential votes.

Every AutoRecovery process creates a vote `<root>/underreplication/auditorelection/V_<seq>`
(ephemeral, sequential; data = text AuditorVoteFormat naming its bookie). The
lowest sequence number wins. The winner writes its AuditorVoteFormat into the
`auditorelection` node itself (so `whoisauditor` can name it) and starts its
Auditor; every other voter watches the vote just below its own, so a death
wakes exactly one voter, which then looks again (BookKeeper's recipe).

A vote dies with its session: a voter whose vote vanished (session expiry)
stops its Auditor, if it had one, and votes again; a metadata error while
voting or watching does the same after a pause. Because a new auditor only
starts after the old vote is gone, and the old one stops as soon as it sees its
vote gone, two auditors overlap at most for the time it takes the old one to
notice - their work (marking ledgers) is idempotent.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from bk import metrics
from bk.eventloop import cancel_and_wait
from bk.errors import BKError, MetadataFormatError, MetadataNotFoundError, MetadataStoreError
from bk.meta import EventType, formats
from bk.meta.cluster import paths_for
from bk.meta.store import MetadataStore, join_path

log = logging.getLogger(__name__)

VOTE_PREFIX = "V_"
RETRY_S = 1.0


def _vote_data(bookie_id: str) -> bytes:
    return formats.to_text(formats.AuditorVoteFormat(bookieId=bookie_id)).encode("utf-8")


def _vote_holder(data: bytes) -> str | None:
    try:
        msg = formats.from_text(formats.AuditorVoteFormat, data)
    except MetadataFormatError:
        return None
    return msg.bookieId if msg.HasField("bookieId") else None


async def current_auditor(store: MetadataStore, root: str | None = None) -> str | None:
    """The bookie whose vote is lowest now (None if nobody votes)."""
    election = paths_for(store, root).auditor_election
    try:
        votes = sorted(v for v in await store.children(election) if v.startswith(VOTE_PREFIX))
    except MetadataNotFoundError:
        return None
    for vote in votes:  # the lowest; a vote deleted under us passes the turn to the next
        try:
            data, _ = await store.get(join_path(election, vote))
        except MetadataNotFoundError:
            continue
        return _vote_holder(data)
    return None


Starter = Callable[[], Awaitable[object]]  # returns something with `async stop()`


class AuditorElector:
    def __init__(self, store: MetadataStore, bookie_id: str, start_auditor: Starter, *, retry_s: float = RETRY_S,
                 root: str | None = None):
        self.store = store
        self.bookie_id = bookie_id
        self.start_auditor = start_auditor
        self.retry_s = retry_s
        self.election = paths_for(store, root).auditor_election
        self.auditor = None
        self.vote: str | None = None
        self.elections_won = 0
        self._stale_votes: list[str] = []  # our votes we could not delete (connection trouble)
        self._task: asyncio.Task | None = None

    @property
    def is_auditor(self) -> bool:
        return self.auditor is not None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"auditor-election-{self.bookie_id}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        await self._step_down()
        await self._withdraw()

    async def _run(self) -> None:
        while True:
            try:
                await self._vote_and_wait()
            except asyncio.CancelledError:
                raise
            except BKError as e:
                log.warning("auditor election (%s): %s; voting again in %.1fs", self.bookie_id, e, self.retry_s)
            except Exception:
                log.exception("auditor election (%s) failed; voting again in %.1fs", self.bookie_id, self.retry_s)
            await self._step_down()
            await self._withdraw()
            await asyncio.sleep(self.retry_s)

    async def _withdraw(self) -> None:
        """Delete our vote(s). A vote that cannot be deleted now is retried before the next vote:
        left alone, a live old vote of ours below the new one would block the election forever."""
        if self.vote is not None:
            self._stale_votes.append(self.vote)
            self.vote = None
        while self._stale_votes:
            try:
                await self.store.delete(self._stale_votes[0])
            except MetadataNotFoundError:
                pass
            except BKError as e:  # the session may be gone, and the vote with it
                log.debug("could not withdraw vote %s yet: %s", self._stale_votes[0], e)
                return
            self._stale_votes.pop(0)

    async def _step_down(self) -> None:
        auditor, self.auditor = self.auditor, None
        if auditor is not None:
            log.info("bookie %s is no longer the auditor", self.bookie_id)
            try:
                await auditor.stop()
            except Exception:
                log.exception("stopping the auditor failed")

    async def _vote_and_wait(self) -> None:
        await self._withdraw()
        if self._stale_votes:
            raise MetadataStoreError(f"old vote {self._stale_votes[0]} could not be withdrawn yet")
        self.vote = await self.store.create(join_path(self.election, VOTE_PREFIX), _vote_data(self.bookie_id),
                                            ephemeral=True, sequential=True, make_parents=True)
        mine = self.vote.rsplit("/", 1)[1]
        while True:
            votes = sorted(v for v in await self.store.children(self.election) if v.startswith(VOTE_PREFIX))
            if mine not in votes:
                raise MetadataStoreError(f"vote {mine} vanished (session expired?)")
            position = votes.index(mine)
            if position == 0:
                await self._lead()
                return  # our vote is gone: vote again
            # Watch only the vote just below ours: its death may make us the lowest.
            version, changed = await self.store.exists_watched(join_path(self.election, votes[position - 1]))
            if version is not None:
                await changed

    async def _lead(self) -> None:
        try:
            await self.store.set(self.election, _vote_data(self.bookie_id))
        except MetadataNotFoundError:
            pass
        self.elections_won += 1
        metrics.ELECTION_ATTEMPTS.inc()
        log.info("bookie %s is the auditor (vote %s)", self.bookie_id, self.vote)
        self.auditor = await self.start_auditor()
        while True:  # lead while our vote exists
            version, changed = await self.store.exists_watched(self.vote)
            if version is None:
                raise MetadataStoreError(f"auditor vote {self.vote} vanished (session expired?)")
            event = await changed
            if event.type is EventType.DELETED:
                raise MetadataStoreError(f"auditor vote {self.vote} was deleted")
