"""Cookies: a bookie's identity, in ZooKeeper and in every one of its directories.

Text form (BookKeeper's cookie layout 5): `5\\n` + the protobuf text of
`CookieFormat`. Directory lists are written the way BookKeeper writes them:
`ledgerDirs` and `indexDirs` as the count then the paths, tab-separated
(`2\\t/d1\\t/d2`); `journalDir` as BookKeeper's Cookie.generateCookie writes it,
the journal paths joined with ',' (a single journal dir is just its path).
Layout 3 (plain lines) and 4 are read too.

Stored at `<root>/cookies/<bookie_id>` and as `current/VERSION` in each journal,
ledger and index directory. `verify_cookies` applies METADATA.md's boot rules.
"""
from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from bk.errors import CookieError, MetadataExistsError, MetadataFormatError, MetadataNotFoundError
from bk.fileio import atomic_write, ensure_dir
from bk.meta import formats
from bk.meta.cluster import paths_for, read_instance_id
from bk.meta.store import MetadataStore

COOKIE_LAYOUT_VERSION = 5
VERSION_FILENAME = "VERSION"
_SEPARATOR = "\t"


def encode_dir_paths(dirs: tuple[str, ...]) -> str:
    return _SEPARATOR.join([str(len(dirs)), *dirs])


def decode_dir_paths(text: str) -> tuple[str, ...]:
    count, sep, rest = text.partition(_SEPARATOR)
    if not count.isdigit():
        raise MetadataFormatError(f"malformed cookie directory list {text!r}: no leading count")
    dirs = tuple(rest.split(_SEPARATOR)) if sep else ()
    if len(dirs) != int(count):
        raise MetadataFormatError(f"malformed cookie directory list {text!r}: count {count}, {len(dirs)} paths")
    return _no_empty_path(dirs, text)


def _decode_journal_dirs(text: str) -> tuple[str, ...]:
    # BookKeeper joins journal dirs with ','; accept a count+tab list as well.
    count, sep, _ = text.partition(_SEPARATOR)
    if sep and count.isdigit():
        dirs = decode_dir_paths(text)
        # to_text writes BookKeeper's ',' form, in which such a path would come back split
        # in two (fuzz/regressions/cookie/comma-in-counted-journal-dir)
        if any("," in d for d in dirs):
            raise MetadataFormatError(f"malformed cookie journal directory list {text!r}: a path with ','")
        return dirs
    return _no_empty_path(tuple(text.split(",")), text) if text else ()


def _no_empty_path(dirs: tuple[str, ...], text: str) -> tuple[str, ...]:
    # A directory is a path: an empty one cannot be written back (',' joins nothing) and would
    # compare equal to no directory at all (fuzz/regressions/cookie/empty-journal-dir).
    if "" in dirs:
        raise MetadataFormatError(f"malformed cookie directory list {text!r}: an empty path")
    return dirs


@dataclass(frozen=True)
class Cookie:
    bookie_host: str
    journal_dirs: tuple[str, ...]
    ledger_dirs: tuple[str, ...]
    instance_id: str | None = None
    index_dirs: tuple[str, ...] | None = None
    layout_version: int = COOKIE_LAYOUT_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "journal_dirs", tuple(self.journal_dirs))
        object.__setattr__(self, "ledger_dirs", tuple(self.ledger_dirs))
        if self.index_dirs is not None:
            object.__setattr__(self, "index_dirs", tuple(self.index_dirs))

    def to_text(self) -> str:
        msg = formats.CookieFormat(
            bookieHost=self.bookie_host,
            journalDir=",".join(self.journal_dirs),
            ledgerDirs=encode_dir_paths(self.ledger_dirs),
        )
        if self.instance_id is not None:
            msg.instanceId = self.instance_id
        if self.index_dirs is not None:
            msg.indexDirs = encode_dir_paths(self.index_dirs)
        return f"{COOKIE_LAYOUT_VERSION}\n{formats.to_text(msg)}"

    def to_bytes(self) -> bytes:
        return self.to_text().encode("utf-8")

    @classmethod
    def parse(cls, data: bytes | str) -> "Cookie":
        if isinstance(data, (bytes, bytearray, memoryview)):
            try:
                data = bytes(data).decode("utf-8")
            except UnicodeDecodeError:
                raise MetadataFormatError("malformed cookie: not UTF-8 text") from None
        first, _, body = data.partition("\n")
        try:
            version = int(first.strip())
        except ValueError:
            raise MetadataFormatError(f"malformed cookie: first line {first!r} is not a layout version") from None
        if version == 3:
            lines = body.split("\n")
            if len(lines) < 3:
                raise MetadataFormatError("malformed layout-3 cookie: needs host, journal and ledger lines")
            return cls(lines[0], _decode_journal_dirs(lines[1]), decode_dir_paths(lines[2]), layout_version=3)
        if version < 3:
            raise MetadataFormatError(f"cookie layout version {version} is too old (3 or later)")
        msg = formats.from_text(formats.CookieFormat, body)
        return cls(
            bookie_host=msg.bookieHost,
            journal_dirs=_decode_journal_dirs(msg.journalDir),
            ledger_dirs=decode_dir_paths(msg.ledgerDirs),
            # BookKeeper treats an empty instance id as none
            instance_id=msg.instanceId if msg.HasField("instanceId") and msg.instanceId else None,
            index_dirs=decode_dir_paths(msg.indexDirs) if msg.HasField("indexDirs") else None,
            layout_version=version,
        )

    def differences(self, expected: "Cookie") -> list[str]:
        """What differs from `expected`, field by field, as "field: stored X, expected Y"
        (the layout version is not compared: layouts 3-5 describe the same identity)."""
        out = []
        for name in ("bookie_host", "journal_dirs", "ledger_dirs", "instance_id", "index_dirs"):
            mine, theirs = getattr(self, name), getattr(expected, name)
            if mine != theirs:
                out.append(f"{name}: stored {_show(mine)}, expected {_show(theirs)}")
        return out


def _show(value) -> str:
    return "[" + ", ".join(value) + "]" if isinstance(value, tuple) else repr(value)


# ---------------------------------------------------------------------- ZooKeeper
class CookieStore:
    """Cookies under `<root>/cookies/<bookie_id>`, versioned for compare-and-set."""

    def __init__(self, store: MetadataStore, root: str | None = None):
        self.store = store
        self.paths = paths_for(store, root)

    async def read(self, bookie_id: str) -> tuple[Cookie, int]:
        """(cookie, version); MetadataNotFoundError if the bookie has none."""
        path = self.paths.cookie(bookie_id)
        data, version = await self.store.get(path)
        try:
            return Cookie.parse(data), version
        except MetadataFormatError as e:
            raise MetadataFormatError(f"cookie at {path}: {e}") from None

    async def write(self, bookie_id: str, cookie: Cookie, version: int | None = None) -> int:
        """version None: create (MetadataExistsError if present); else CAS replace."""
        path = self.paths.cookie(bookie_id)
        if version is None:
            await self.store.create(path, cookie.to_bytes(), make_parents=True)
            return 0
        return await self.store.set(path, cookie.to_bytes(), version)

    async def delete(self, bookie_id: str, version: int = -1) -> None:
        await self.store.delete(self.paths.cookie(bookie_id), version)


# ---------------------------------------------------------------------- directories
def config_cookie(bookie_id: str, journal_dirs, ledger_dirs, index_dir: str | None,
                  instance_id: str | None) -> Cookie:
    """The cookie a bookie with these directories must have (`index_dir` only when the index is
    configured apart from the ledger dirs; verify_cookies builds the same)."""
    return Cookie(bookie_id, tuple(journal_dirs), tuple(ledger_dirs), instance_id,
                  (index_dir,) if index_dir else None)


def cookie_file(directory: str) -> str:
    return os.path.join(directory, "current", VERSION_FILENAME)


def write_directory_cookie(directory: str, cookie: Cookie) -> None:
    """Durably write `<directory>/current/VERSION` (blocking: not on the loop)."""
    ensure_dir(os.path.join(directory, "current"))
    atomic_write(cookie_file(directory), cookie.to_bytes())


def read_directory_cookie(directory: str) -> Cookie | None:
    """The directory's cookie, or None if it has none; CookieError if unreadable."""
    path = cookie_file(directory)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CookieError(f"cannot read cookie {path}: {e}") from None
    try:
        return Cookie.parse(data)
    except MetadataFormatError as e:
        raise CookieError(f"cookie {path} is malformed: {e}") from None


def directory_is_empty(directory: str) -> bool:
    """No data under `current/` (a cookie or a half-written one does not count)."""
    try:
        names = os.listdir(os.path.join(directory, "current"))
    except FileNotFoundError:
        return True
    return all(name in (VERSION_FILENAME, VERSION_FILENAME + ".tmp") for name in names)


@dataclass(frozen=True)
class CookieCheck:
    cookie: Cookie  # the cookie this configuration should have
    new_bookie: bool  # True: nothing existed; everything has just been stamped
    problems: tuple[str, ...]  # empty when everything matches
    zk_version: int | None  # version of the ZooKeeper cookie (None: missing)
    zk_mismatch: bool = False  # ZooKeeper's cookie differs, or is missing while directories have one
    missing_dirs: tuple[str, ...] = ()  # directories without a cookie (wiped or replaced disks)
    dir_mismatches: tuple[str, ...] = ()  # directories whose cookie differs from this configuration

    @property
    def ok(self) -> bool:
        return not self.problems


async def verify_cookies(
    store: MetadataStore,
    bookie_id: str,
    journal_dirs,
    ledger_dirs,
    index_dir: str | None = None,
    instance_id: str | None = None,
    *,
    root: str | None = None,
    allow_repair: bool = False,
) -> CookieCheck:
    """Boot-time cookie check (METADATA.md, Cookies).

    - no cookie anywhere and every directory empty: a new bookie; the ZooKeeper
      cookie is created (fails if another process races with the same id) and
      every directory is stamped;
    - otherwise every directory must hold a cookie equal to this configuration's
      and ZooKeeper must hold one too; any difference raises CookieError naming
      each directory and what differs, unless `allow_repair` (BP-46), which returns
      the problems so the caller can repair and then `stamp_cookies`.
    `index_dir` is only part of the cookie when the index is configured apart from
    the ledger dirs; `instance_id` None reads the cluster's INSTANCEID.
    """
    if instance_id is None:
        instance_id = await read_instance_id(store, root)
    expected = Cookie(
        bookie_id, tuple(journal_dirs), tuple(ledger_dirs), instance_id, (index_dir,) if index_dir else None
    )
    directories = cookie_directories(expected)
    cookies = CookieStore(store, root)
    try:
        zk_cookie, zk_version = await cookies.read(bookie_id)
    except MetadataNotFoundError:
        zk_cookie, zk_version = None, None
    except MetadataFormatError as e:
        raise CookieError(str(e)) from None

    loop = asyncio.get_running_loop()

    def scan():
        return [(d, read_directory_cookie(d), directory_is_empty(d)) for d in directories]

    found = await loop.run_in_executor(None, scan)

    if zk_cookie is None and all(c is None for _, c, _ in found) and all(empty for _, _, empty in found):
        try:
            zk_version = await stamp_cookies(store, expected, directories, None, root=root)
        except MetadataExistsError:
            raise CookieError(f"bookie {bookie_id}: another process created its cookie at the same time") from None
        return CookieCheck(expected, True, (), zk_version)

    problems = []
    zk_mismatch = False
    if zk_cookie is None:
        with_cookie = [d for d, c, _ in found if c is not None]
        if with_cookie:
            zk_mismatch = True
            problems.append(
                f"ZooKeeper has no cookie for bookie {bookie_id} ({cookies.paths.cookie(bookie_id)})"
                f" but directories have one: {', '.join(with_cookie)}"
            )
    else:
        diff = zk_cookie.differences(expected)
        if diff:
            zk_mismatch = True
            problems.append(f"ZooKeeper cookie of {bookie_id} differs from this configuration: {'; '.join(diff)}")
    missing, mismatched = [], []
    for directory, cookie, empty in found:
        if cookie is None:
            missing.append(directory)
            what = "an empty directory" if empty else "a directory with data"
            problems.append(f"{directory} has no cookie ({cookie_file(directory)} missing; {what})")
        else:
            diff = cookie.differences(expected)
            if diff:
                mismatched.append(directory)
                problems.append(f"{directory} has a cookie that differs: {'; '.join(diff)}")
    check = CookieCheck(expected, False, tuple(problems), zk_version, zk_mismatch, tuple(missing), tuple(mismatched))
    if problems and not allow_repair:
        raise CookieError(f"bookie {bookie_id} refuses to start: " + " | ".join(problems))
    return check


def cookie_directories(cookie: Cookie) -> list[str]:
    """Every directory a cookie names, once each, in journal, ledger, index order."""
    return list(dict.fromkeys([*cookie.journal_dirs, *cookie.ledger_dirs, *(cookie.index_dirs or ())]))


async def stamp_cookies(
    store: MetadataStore,
    cookie: Cookie,
    directories,
    zk_version: int | None,
    *,
    root: str | None = None,
) -> int:
    """Write the cookie to ZooKeeper (create if `zk_version` is None, else CAS) and
    then into every directory. ZooKeeper goes first so that two processes claiming
    the same bookie id collide there before touching any directory. Returns the
    ZooKeeper cookie's new version."""
    version = await CookieStore(store, root).write(cookie.bookie_host, cookie, zk_version)
    loop = asyncio.get_running_loop()

    def stamp():
        for directory in directories:
            write_directory_cookie(directory, cookie)

    await loop.run_in_executor(None, stamp)
    return version
