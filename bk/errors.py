"""One exception tree for the whole project.

`BookieError` subclasses map 1:1 to wire status codes through `_BY_CODE`, so the
server turns an exception into a return code, and the client turns a return code
back into the same exception, in one place each. Codes are BookKeeper's v2 values
(PROTOCOL.md) and `v3_code` the v3 protobuf StatusCode of the same status: these
classes are the project's only status table (bk.proto.constants.StatusCode and
its v2<->v3 maps are built from them). Library exceptions (kazoo, lmdb) never leak above `meta`/`index`:
those packages translate them into these classes.
"""
from __future__ import annotations


class BKError(Exception):
    """Root of every error this project raises on purpose."""


class ConfigError(BKError):
    """A setting is unknown or has a bad value; the message names the key."""


# ---------------------------------------------------------------- bookie / wire
class BookieError(BKError):
    """An error a bookie reports over the wire. `code` is the v2 return code."""

    code = 101  # EIO unless a subclass says otherwise
    v3_code = 501  # the same status in the v3 protobuf StatusCode enum
    name = "EIO"

    def __init__(self, message: str = "", *, ledger_id: int | None = None, entry_id: int | None = None):
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        if not message:
            message = self.name
            if ledger_id is not None:
                message += f" (ledger {ledger_id}" + (f", entry {entry_id})" if entry_id is not None else ")")
        super().__init__(message)


class NoSuchLedgerError(BookieError):
    code, v3_code, name = 1, 402, "ENOLEDGER"


class NoSuchEntryError(BookieError):
    code, v3_code, name = 2, 403, "ENOENTRY"


class BadRequestError(BookieError):
    code, v3_code, name = 100, 404, "EBADREQ"


class BookieIOError(BookieError):
    code, v3_code, name = 101, 501, "EIO"


class UnauthorizedAccessError(BookieError):
    code, v3_code, name = 102, 502, "EUA"


class BadVersionError(BookieError):
    code, v3_code, name = 103, 503, "EBADVERSION"


class LedgerFencedError(BookieError):
    code, v3_code, name = 104, 504, "EFENCED"


class BookieReadOnlyError(BookieError):
    code, v3_code, name = 105, 505, "EREADONLY"


class TooManyRequestsError(BookieError):
    code, v3_code, name = 106, 506, "ETOOMANYREQUESTS"


class LedgerLimboError(BookieError):
    code, v3_code, name = 107, 507, "EUNKNOWNLEDGERSTATE"


_BY_CODE: dict[int, type[BookieError]] = {
    cls.code: cls
    for cls in (
        NoSuchLedgerError,
        NoSuchEntryError,
        BadRequestError,
        BookieIOError,
        UnauthorizedAccessError,
        BadVersionError,
        LedgerFencedError,
        BookieReadOnlyError,
        TooManyRequestsError,
        LedgerLimboError,
    )
}


STATUS_CLASSES: tuple[type[BookieError], ...] = tuple(_BY_CODE.values())


def error_for_code(code: int, message: str = "", **ids) -> BookieError:
    """The exception for a wire return code; unknown codes become EIO."""
    cls = _BY_CODE.get(code, BookieIOError)
    err = cls(message, **ids)
    if cls is BookieIOError and code != BookieIOError.code:
        err.code = code  # keep the code we were given, for logs
    return err


def code_name(code: int) -> str:
    cls = _BY_CODE.get(code)
    return "EOK" if code == 0 else (cls.name if cls else f"E{code}")


# ---------------------------------------------------------------- storage (local)
class StorageError(BookieIOError):
    """Local storage failed; answered as EIO, never as an explicit negative."""


class CorruptedStorageError(StorageError):
    """Bytes on disk fail their checks (CRC, ids, lengths). Never "no such entry"."""

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None, **ids):
        self.path = path
        self.offset = offset
        super().__init__(message, **ids)


class IndexFullError(StorageError):
    """The LMDB map is full; the message names `index_map_size_bytes`."""


class DiskFullError(StorageError):
    """No space left on a bookie directory."""


class SyncFailedError(StorageError):
    """An fsync failed: what the file held since its last good fsync may be lost, and no
    later fsync of that file can prove otherwise (fsyncgate; docs/DISK-FAULTS.md)."""


class CookieError(BKError):
    """A directory's cookie is missing or differs from ZooKeeper's; names the directory."""


# ---------------------------------------------------------------- client
class ClientError(BKError):
    pass


class LedgerClosedError(ClientError):
    pass


class NotEnoughBookiesError(ClientError):
    pass


class DigestMismatchError(ClientError):
    pass


class MetadataVersionError(ClientError):
    """A compare-and-set on metadata lost against a concurrent change."""


class LedgerRecoveryError(ClientError):
    """Ledger recovery could not decide; the ledger was left OPEN/IN_RECOVERY (never closed short).

    Machine fields (all optional): `ledger_id`; `entry_id` (the undecided entry, None for a
    fencing failure); `answers` ({bookie: what it answered}); `unknown_bookies` (answers that
    are neither a valid copy nor an explicit negative); `limbo_bookies` (those that answered
    EUNKNOWNLEDGERSTATE: they may have lost data in a crash without the journal);
    `data_loss` (True: the entry was certainly acknowledged and no replica holds it)."""

    def __init__(self, message: str = "", *, ledger_id: int | None = None, entry_id: int | None = None,
                 answers: dict | None = None, unknown_bookies: tuple = (), limbo_bookies: tuple = (),
                 data_loss: bool = False):
        super().__init__(message)
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.answers = dict(answers or {})
        self.unknown_bookies = tuple(unknown_bookies)
        self.limbo_bookies = tuple(limbo_bookies)
        self.data_loss = data_loss


class ReplicationError(ClientError):
    """A segment of a ledger could not be re-replicated (no readable replica, target refused, ...)."""


class NoSuchLedgerMetadataError(ClientError):
    """The ledger has no metadata (never created, or deleted)."""


class IncorrectParameterError(ClientError, ValueError):
    """A client call with bad arguments: quorum sizes, an entry range past the LAC, an entry too large."""


class DuplicateEntryIdError(IncorrectParameterError):
    """create_ledger_adv: an entry id already added on this handle (pending, or at or below its LAC):
    BookKeeper's DuplicateEntryIdException. The add was not sent."""


class LedgerExistsError(ClientError):
    """create_ledger_adv with a ledger id that already has metadata (BookKeeper's LedgerExistException)."""


class AddBatchError(ClientError):
    """A batch of adds (`LedgerHandle.add_entries`) that did not all succeed.

    Completions are in entry-id order, so what succeeded is a prefix:
    `acknowledged` (entry ids stored on AQ bookies), then `failed` (entry ids
    that were given out but did not succeed: each may or may not be in the
    ledger when `outcome_unknown`, see the cause), then `not_added` payloads at
    the end of the batch that were never given an id (certainly not written).
    `__cause__` is the first error (its class says why)."""

    def __init__(self, message: str, *, acknowledged: list, failed: list, not_added: int,
                 outcome_unknown: bool):
        super().__init__(message)
        self.acknowledged = acknowledged
        self.failed = failed
        self.not_added = not_added
        self.outcome_unknown = outcome_unknown

    @classmethod
    def of_batch(cls, first_entry_id: int, acked: int, count: int, total: int, err: BaseException,
                 unknown: bool) -> "AddBatchError":
        """The error of a batch of `total` payloads whose first `count` got the ids from
        `first_entry_id` on, the first `acked` of them succeeding; `err` is the first failure and
        `unknown` tells whether any failed add may have been stored (its error's outcome_unknown)."""
        acknowledged = list(range(first_entry_id, first_entry_id + acked))
        failed = list(range(first_entry_id + acked, first_entry_id + count))
        unknown = bool(failed) and unknown
        what = f"{acked} acknowledged"
        if failed:
            what += f", entries {failed[0]}..{failed[-1]} failed" + (" (outcome unknown)" if unknown else
                                                                     " (not written)")
        if total > count:
            what += f", {total - count} never added"
        e = cls(f"batch of adds: {what}: {err}", acknowledged=acknowledged, failed=failed, not_added=total - count,
                outcome_unknown=unknown)
        e.__cause__ = err
        return e


class BookieConnectionError(BookieIOError):
    """Client side, never on the wire: a bookie could not be reached or its connection was lost."""


class BookieTimeoutError(BookieIOError):
    """Client side, never on the wire: a bookie did not answer a request in time."""


class MetadataStoreError(BKError):
    """The metadata store (ZooKeeper) failed or is unreachable."""


class MetadataNotFoundError(MetadataStoreError):
    """The znode does not exist (ZooKeeper NoNode)."""


class MetadataExistsError(MetadataStoreError):
    """The znode already exists (ZooKeeper NodeExists)."""


class MetadataNotEmptyError(MetadataStoreError):
    """The znode has children and cannot be deleted (ZooKeeper NotEmpty)."""


class MetadataFormatError(MetadataStoreError):
    """Metadata bytes or values are malformed (bad header, protobuf, invalid fields)."""


class ProtocolError(BKError):
    """Malformed bytes on the wire: the connection that sent them is closed."""
