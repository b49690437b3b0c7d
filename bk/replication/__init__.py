"""Bookie recovery: bring a lost bookie's data back to full replication (REPLICATION.md).

Modules:
- replicator: copy a lost bookie's share of a segment to a target bookie and CAS the
  metadata (LedgerReplicator, segment/entry arithmetic, RateLimiter);
- checker: LedgerChecker, does each bookie still hold its share (first/last entry probes);
- bookie_recovery: manual recovery of every ledger on a bookie (BookieRecovery, `bk shell recover`);
- election: AuditorElector (ephemeral-sequential votes) and current_auditor;
- auditor: Auditor (lost bookies with a delay, periodic bookie and ledger checks, marks ledgers);
- worker: ReplicationWorker (locks a marked ledger, replicates to its own bookie, unmarks);
- autorecovery: AutoRecovery, the election + worker of one bookie (in the bookie or standalone);
- admin: the operator switches used by the shell (trigger audit, list, decommission).
"""
from bk.replication.auditor import Auditor
from bk.replication.autorecovery import AutoRecovery
from bk.replication.bookie_recovery import BookieRecovery, LedgerPlan, RecoverySummary
from bk.replication.checker import LedgerChecker
from bk.replication.election import AuditorElector, current_auditor
from bk.replication.replicator import LedgerReplicator, RateLimiter
from bk.replication.worker import ReplicationWorker

__all__ = ["Auditor", "AuditorElector", "AutoRecovery", "BookieRecovery", "LedgerChecker", "LedgerPlan",
           "LedgerReplicator", "RateLimiter", "RecoverySummary", "ReplicationWorker", "current_auditor"]
