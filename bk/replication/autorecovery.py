"""AutoRecovery: the Auditor election and a ReplicationWorker for one bookie, in one process.

    ar = AutoRecovery(config)            # a BookieConfig; config.bookie_id is the local bookie
    await ar.start()
    ...
    await ar.stop()

Started by BookieServer after registration when `autorecovery_enabled` is set,
or on its own by `bk autorecovery --conf FILE` next to a bookie. It has its own
BookKeeper client, hence its own metadata session: its vote and its locks are
ephemeral nodes of that session, so they vanish when the process dies (or
stop() closes the session), and another AutoRecovery takes over.

Settings used: metadata_service_uri, lost_bookie_recovery_delay_s,
auditor_periodic_check_interval_s, auditor_periodic_bookie_check_interval_s,
auditor_periodic_placement_policy_check_interval_s,
repaired_placement_policy_not_adhering_bookie_enable (the Auditor marks, the worker moves),
open_ledger_rereplication_grace_period_ms, rereplication_entry_batch_size,
replication_rate_bytes_per_s.
"""
from __future__ import annotations

import logging

from bk.meta.underreplication import LedgerUnderreplicationManager

from .auditor import Auditor
from .election import AuditorElector, current_auditor
from .worker import ReplicationWorker

log = logging.getLogger(__name__)


class AutoRecovery:
    def __init__(self, config, *, bookie_id: str | None = None, idle_poll_s: float | None = None,
                 election_retry_s: float | None = None):
        self.config = config
        self.bookie_id = bookie_id or config.bookie_id
        self._idle_poll_s = idle_poll_s
        self._election_retry_s = election_retry_s
        self.bk = None
        self.urm: LedgerUnderreplicationManager | None = None
        self.elector: AuditorElector | None = None
        self.worker: ReplicationWorker | None = None

    async def start(self) -> "AutoRecovery":
        from bk.client import BookKeeper

        cfg = self.config
        self.bk = BookKeeper.for_bookie(cfg)
        await self.bk.start()
        try:
            self.urm = LedgerUnderreplicationManager(self.bk.store)
            worker_options = {} if self._idle_poll_s is None else {"idle_poll_s": self._idle_poll_s}
            self.worker = ReplicationWorker(
                self.bk, self.urm, self.bookie_id,
                open_grace_s=cfg.open_ledger_rereplication_grace_period_ms / 1000.0,
                window_entries=cfg.rereplication_entry_batch_size,
                rate_bytes_per_s=cfg.replication_rate_bytes_per_s,
                repair_placement=cfg.repaired_placement_policy_not_adhering_bookie_enable, **worker_options)
            election_options = {} if self._election_retry_s is None else {"retry_s": self._election_retry_s}
            self.elector = AuditorElector(self.bk.store, self.bookie_id, self._start_auditor, **election_options)
            self.elector.start()
            self.worker.start()
        except BaseException:
            await self.stop()
            raise
        log.info("autorecovery started for bookie %s", self.bookie_id)
        return self

    async def _start_auditor(self) -> Auditor:
        cfg = self.config
        auditor = Auditor(self.bk, self.urm, self.bookie_id,
                          lost_bookie_recovery_delay_s=cfg.lost_bookie_recovery_delay_s,
                          check_interval_s=cfg.auditor_periodic_check_interval_s,
                          bookie_check_interval_s=cfg.auditor_periodic_bookie_check_interval_s,
                          placement_check_interval_s=cfg.auditor_periodic_placement_policy_check_interval_s,
                          repair_placement=cfg.repaired_placement_policy_not_adhering_bookie_enable)
        return await auditor.start()

    async def stop(self) -> None:
        """Stop the worker (releasing its lock), step down as auditor, close the session."""
        if self.worker is not None:
            await self.worker.stop()
        if self.elector is not None:
            await self.elector.stop()
        if self.urm is not None:
            await self.urm.close()
        if self.bk is not None:
            await self.bk.close()
            log.info("autorecovery stopped for bookie %s", self.bookie_id)
        self.worker = self.elector = self.urm = self.bk = None

    @property
    def is_auditor(self) -> bool:
        return self.elector is not None and self.elector.is_auditor

    @property
    def auditor(self) -> Auditor | None:
        return self.elector.auditor if self.elector is not None else None

    async def current_auditor(self) -> str | None:
        return await current_auditor(self.bk.store)

    async def __aenter__(self) -> "AutoRecovery":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()
