"""`bk shell bookieformat`: wipe a stopped bookie's local data (BookKeeper's bookieformat).

    bk shell --conf bookie.toml bookieformat [--delete-cookie] [--yes] [--force] [--json]

Destroys data on purpose, so it first proves nobody needs it, and orders its steps so
that a crash anywhere leaves a bookie that cannot boot as if its data were intact:
1. Refuse while the bookie is registered or its port answers (it is running), and, unless
   --force, while the metadata of any ledger still names it: a formatted bookie would
   answer "no such entry" for entries it held. Recover or decommission it first
   (`bk shell recover` / `decommissionbookie`).
2. Remove the cookie (current/VERSION) of every journal, ledger and index directory, each
   removal made durable (directory fsync). From the first removal on, the boot-time cookie
   check refuses this bookie (or, with BP-46 cookie stamping, fences and repairs it).
3. Delete everything in those directories.
4. With --delete-cookie, delete the ZooKeeper cookie last: the bookie then starts as a new
   one. Without it the bookie refuses to start until the cookie is dealt with
   (`bk shell cookie delete`, or BP-46 stamping), as BookKeeper's does.
Running the command again after a crash finishes what was left.

Test hook: BK_TEST_FORMAT_CRASH_AFTER=<step> (`dir-cookie:N`, `data:N`) ends the process
with os._exit(137) right after that step (tests/integration/test_bookieformat.py).
"""
from __future__ import annotations

import os
import shutil
import socket
import sys

from bk.errors import BKError, ConfigError, MetadataNotFoundError

from .commands import arg, command_table

COMMANDS, command = command_table()
CRASH_HOOK = "BK_TEST_FORMAT_CRASH_AFTER"


def _crash_point(step: str) -> None:
    if os.environ.get(CRASH_HOOK) == step:
        os._exit(137)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _port_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


async def _named_in(store, bookie_id: str) -> list[int]:
    from bk.meta.ledger_manager import LedgerManager
    return [lid async for lid, md, _ in LedgerManager(store).iter_ledger_metadata()
            if any(bookie_id in ensemble for _, ensemble in md.segments)]


@command(
    "bookieformat", help="wipe a STOPPED bookie's journal, ledger and index directories (needs --conf)",
    description=__doc__.split("\n\n", 2)[2].split("Test hook")[0].strip(), raw_description=True,
    args=(arg("--delete-cookie", action="store_true", help="also delete the bookie's cookie in ZooKeeper"),
          arg("--yes", "-y", action="store_true", help="do not ask for confirmation"),
          arg("--force", action="store_true",
              help="format even though ledger metadata still names this bookie (their copies here are lost)")))
async def cmd_bookieformat(uri, args):
    from bk.config import load_config
    from bk.meta import open_store
    from bk.meta.cookie import Cookie, CookieStore, cookie_directories, cookie_file
    from bk.meta.registration import RegistrationManager

    if not args.conf:
        raise ConfigError("bookieformat needs the stopped bookie's configuration: bk shell --conf FILE bookieformat")
    cfg = load_config(args.conf)
    bookie_id = cfg.bookie_id
    dirs = cookie_directories(Cookie(bookie_id, cfg.journal_dirs, cfg.ledger_dirs, None,
                                     (cfg.index_dir,) if cfg.index_dir else None))
    if _port_answers(cfg.bind_address or cfg.advertised_address, cfg.bookie_port):
        raise BKError(f"something answers on {bookie_id}'s port: stop the bookie first; nothing deleted")
    store = await open_store(uri)
    try:
        rm = RegistrationManager(store, reregister_on_expiry=False)
        registered = await rm.registration(bookie_id)
        await rm.close()
        if registered is not None:
            raise BKError(f"bookie {bookie_id} is registered ({registered}): stop it first; nothing deleted")
        named = await _named_in(store, bookie_id)
        if named and not args.force:
            shown = ", ".join(map(str, named[:10])) + (" ..." if len(named) > 10 else "")
            raise BKError(f"{len(named)} ledgers still name {bookie_id} in their ensembles ({shown}): recover or"
                          " decommission the bookie first (bk shell recover / decommissionbookie), or --force to"
                          " lose its copies; nothing deleted")
        if not args.yes:
            if not sys.stdin.isatty():
                raise BKError("bookieformat deletes data: confirm with --yes (no terminal to ask on); nothing deleted")
            answer = input(f"delete everything in {', '.join(dirs)}"
                           f"{' and the ZooKeeper cookie' if args.delete_cookie else ''} of {bookie_id}? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                return {"ok": False, "formatted": False, "text": "not confirmed: nothing deleted"}
        for n, d in enumerate(dirs, 1):  # step 2: no directory can pass for intact any more
            path = cookie_file(d)
            if os.path.exists(path):
                os.unlink(path)
                _fsync_dir(os.path.dirname(path))
            _crash_point(f"dir-cookie:{n}")
        removed = 0
        for n, d in enumerate(dirs, 1):  # step 3
            if os.path.isdir(d):
                for name in os.listdir(d):
                    p = os.path.join(d, name)
                    if os.path.isdir(p) and not os.path.islink(p):
                        shutil.rmtree(p)
                    else:
                        os.unlink(p)
                    removed += 1
                _fsync_dir(d)
            _crash_point(f"data:{n}")
        zk_deleted = False
        if args.delete_cookie:  # step 4
            try:
                await CookieStore(store).delete(bookie_id)
                zk_deleted = True
            except MetadataNotFoundError:  # a run cut short after this step: done already
                pass
    finally:
        await store.close()
    text = (f"formatted bookie {bookie_id}: {', '.join(dirs)} emptied ({removed} entries removed)"
            + ("; ZooKeeper cookie deleted: it starts as a new bookie" if args.delete_cookie else
               "; the ZooKeeper cookie is kept, so it will refuse to start until that is dealt with"
               " (bk shell cookie delete, or --delete-cookie)"))
    return {"ok": True, "formatted": True, "bookie_id": bookie_id, "directories": dirs,
            "ledgers_naming_it": len(named), "zk_cookie_deleted": zk_deleted, "text": text}
