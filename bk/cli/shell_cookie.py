"""`bk shell cookie ...`: a bookie's cookie, in ZooKeeper and in its directories (registered by
bk.cli.shell; BookKeeper's cookie_get / cookie_update / cookie_delete / cookie_generate /
updatecookie).

    cookie show [BOOKIE_ID] [--conf FILE]
    cookie update [BOOKIE_ID] [--new-bookie-id HOST:PORT] [--journal-dirs D,..] [--ledger-dirs D,..]
                  [--index-dir D | --no-index-dir] [--dirs-from-conf] [--conf FILE] [--force]
    cookie delete BOOKIE_ID [--force]
    cookie generate [BOOKIE_ID] [--conf FILE] [--journal-dirs D,..] [--ledger-dirs D,..]
                    [--index-dir D] [--instance-id ID] [--output FILE] [--force]

A cookie is a bookie's identity (METADATA.md, Cookies): its address, its journal, ledger and
index directories and the cluster's instance id, kept at <root>/cookies/<bookie_id> and as
current/VERSION in every one of those directories. A bookie refuses to start when they
disagree. BOOKIE_ID defaults to the one --conf FILE describes (advertised_address:bookie_port).

Every change is a compare-and-set on the ZooKeeper cookie's version, refused while the bookie is
registered (running) unless --force, and checked against the directories before anything is
written. --json prints only machine fields; failures exit 1 with the reason on stderr.
"""
from __future__ import annotations

import asyncio
import os

from bk.errors import BKError, CookieError, MetadataNotFoundError, MetadataVersionError

from .commands import action, arg, command_table, one_of

COMMANDS, command = command_table()


# ---------------------------------------------------------------- helpers
def _result(args, fields: dict, text: str) -> dict:
    """The command's result: machine fields only with --json, else with the text to print."""
    return dict(fields) if args.json else {**fields, "text": text}


def _config(args):
    if not args.conf:
        return None
    from bk.config import load_config
    return load_config(args.conf)


def _valid_id(bookie_id: str, what: str = "bookie id") -> str:
    from bk.meta.cluster import check_bookie_id
    from bk.meta.registration import split_bookie_id
    try:
        split_bookie_id(check_bookie_id(bookie_id))
    except BKError as e:
        raise BKError(f"bad {what} {bookie_id!r}: {e}") from None
    return bookie_id


def _bookie_id(args, cfg) -> str:
    if args.bookie_id:
        return _valid_id(args.bookie_id)
    if cfg is not None:
        return _valid_id(cfg.bookie_id)
    raise BKError("name the bookie (host:port) or give its configuration with --conf FILE")


def _dirs(text: str | None, what: str) -> tuple[str, ...] | None:
    if text is None:
        return None
    dirs = tuple(d.strip() for d in text.split(",") if d.strip())
    if not dirs:
        raise BKError(f"--{what} needs at least one directory")
    return dirs


def _fields(cookie) -> dict | None:
    if cookie is None:
        return None
    return {"bookie_host": cookie.bookie_host, "instance_id": cookie.instance_id,
            "journal_dirs": list(cookie.journal_dirs), "ledger_dirs": list(cookie.ledger_dirs),
            "index_dirs": None if cookie.index_dirs is None else list(cookie.index_dirs),
            "layout_version": cookie.layout_version}


def _changes(old, new) -> list[str]:
    """"field: OLD -> NEW" for each field that differs (the layout version is not a change)."""
    out = []
    for name in ("bookie_host", "journal_dirs", "ledger_dirs", "instance_id", "index_dirs"):
        before, after = getattr(old, name), getattr(new, name)
        if before != after:
            show = (lambda v: "[" + ", ".join(v) + "]" if isinstance(v, tuple) else str(v))
            out.append(f"{name}: {show(before)} -> {show(after)}")
    return out


def _describe(cookie, indent: str = "  ") -> list[str]:
    index = ", ".join(cookie.index_dirs) if cookie.index_dirs else "(in the first ledger directory)"
    return [f"{indent}bookie host   {cookie.bookie_host}",
            f"{indent}instance id   {cookie.instance_id or '(none)'}",
            f"{indent}journal dirs  {', '.join(cookie.journal_dirs)}",
            f"{indent}ledger dirs   {', '.join(cookie.ledger_dirs)}",
            f"{indent}index dir     {index}"]


async def _registration(store, *bookie_ids: str) -> dict:
    """{bookie_id: 'writable' | 'readonly'} for those registered as available now."""
    from bk.meta.registration import RegistrationManager
    rm = RegistrationManager(store)
    found = {}
    for bookie_id in bookie_ids:
        state = await rm.registration(bookie_id)
        if state is not None:
            found[bookie_id] = state
    return found


async def _read_cookie(cookies, bookie_id: str):
    """(cookie, version), or (None, None) when the bookie has no cookie."""
    try:
        return await cookies.read(bookie_id)
    except MetadataNotFoundError:
        return None, None


async def _scan(directories) -> list[tuple[str, object, bool, str | None]]:
    """(directory, cookie or None, empty, error) for each directory (blocking reads off the loop)."""
    from bk.meta.cookie import directory_is_empty, read_directory_cookie

    def scan():
        out = []
        for d in directories:
            try:
                out.append((d, read_directory_cookie(d), directory_is_empty(d), None))
            except CookieError as e:
                out.append((d, None, False, str(e)))
        return out

    return await asyncio.to_thread(scan)


# ---------------------------------------------------------------- show
async def _show(store, args) -> dict:
    from bk.meta.cluster import read_instance_id
    from bk.meta.cookie import CookieStore, config_cookie, cookie_directories

    cfg = _config(args)
    bookie_id = _bookie_id(args, cfg)
    cookies = CookieStore(store)
    zk, version = await _read_cookie(cookies, bookie_id)
    if zk is None and cfg is None:
        raise BKError(f"bookie {bookie_id} has no cookie in ZooKeeper ({cookies.paths.cookie(bookie_id)})")
    registered = (await _registration(store, bookie_id)).get(bookie_id)
    fields = {"bookie_id": bookie_id, "path": cookies.paths.cookie(bookie_id), "zk_version": version,
              "cookie": _fields(zk), "registered": registered}
    lines = [f"bookie {bookie_id}: " + (f"cookie at {fields['path']} (znode version {version})" if zk else
                                        f"NO cookie in ZooKeeper ({fields['path']})")]
    if zk is not None:
        lines += _describe(zk)
    lines.append(f"  registered    {registered or 'no (not running, or not yet registered)'}")
    if cfg is not None:
        if cfg.bookie_id != bookie_id:
            raise BKError(f"--conf {args.conf} describes bookie {cfg.bookie_id}, not {bookie_id}")
        expected = config_cookie(cfg.bookie_id, cfg.journal_dirs, cfg.ledger_dirs, cfg.index_dir or None,
                                 await read_instance_id(store))
        conf_diff = zk.differences(expected) if zk is not None else ["ZooKeeper has no cookie"]
        directories = []
        lines.append(f"directories (from {args.conf}):")
        for d, cookie, empty, error in await _scan(cookie_directories(expected)):
            if error is not None:
                diff, state = [error], f"UNREADABLE: {error}"
            elif cookie is None:
                diff = ["no cookie"]
                state = f"NO COOKIE (current/VERSION missing; {'empty' if empty else 'has data'})"
            else:
                diff = cookie.differences(zk) if zk is not None else ["ZooKeeper has no cookie"]
                state = "matches ZooKeeper" if not diff else "DIFFERS from ZooKeeper: " + "; ".join(diff)
            directories.append({"directory": d, "cookie": _fields(cookie), "empty": empty,
                                "matches_zookeeper": not diff, "differences": diff})
            lines.append(f"  {d}: {state}")
        lines.append("configuration: " + ("matches the ZooKeeper cookie" if not conf_diff else
                                          "DIFFERS from the ZooKeeper cookie: " + "; ".join(conf_diff)))
        fields.update(directories=directories, config_matches_zookeeper=not conf_diff, config_differences=conf_diff,
                      all_match=not conf_diff and all(x["matches_zookeeper"] for x in directories))
        lines.append("all match: the bookie's cookie check passes" if fields["all_match"] else
                     "MISMATCH: the bookie will refuse to start (see `cookie update`)")
    return _result(args, fields, "\n".join(lines))


# ---------------------------------------------------------------- update
def _new_cookie(args, cfg, old):
    from bk.meta.cookie import Cookie
    journal, ledger, index = old.journal_dirs, old.ledger_dirs, old.index_dirs
    if args.dirs_from_conf:
        if cfg is None:
            raise BKError("--dirs-from-conf needs --conf FILE")
        journal, ledger = tuple(cfg.journal_dirs), tuple(cfg.ledger_dirs)
        index = (cfg.index_dir,) if cfg.index_dir else None
    journal = _dirs(args.journal_dirs, "journal-dirs") or journal
    ledger = _dirs(args.ledger_dirs, "ledger-dirs") or ledger
    if args.index_dir:
        index = (args.index_dir,)
    elif args.no_index_dir:
        index = None
    return Cookie(args.new_bookie_id or old.bookie_host, journal, ledger, old.instance_id, index)


async def _check_directories(args, old, new) -> list[str]:
    """Problems that forbid restamping `new` into its directories (the bookie's host, --conf)."""
    from bk.meta.cookie import cookie_directories
    problems = []
    for d, cookie, empty, error in await _scan(cookie_directories(new)):
        if error is not None:
            problems.append(error)
        elif cookie is None:
            if not empty:
                problems.append(f"{d} has data but no cookie: it is not a directory of this bookie")
        elif cookie.differences(old) and cookie.differences(new):
            problems.append(f"{d} holds another cookie: {'; '.join(cookie.differences(old))}")
    return problems


async def _update(store, args) -> dict:
    from bk.meta.cookie import CookieStore, config_cookie, cookie_directories, write_directory_cookie

    cfg = _config(args)
    bookie_id = _bookie_id(args, cfg)
    if args.new_bookie_id:
        _valid_id(args.new_bookie_id, "--new-bookie-id")
    cookies = CookieStore(store)
    old, version = await _read_cookie(cookies, bookie_id)
    if old is None:
        raise BKError(f"bookie {bookie_id} has no cookie in ZooKeeper ({cookies.paths.cookie(bookie_id)}):"
                      " nothing to update (a new bookie creates its cookie when it first starts)")
    new = _new_cookie(args, cfg, old)
    new_id = new.bookie_host
    refusals = []
    running = await _registration(store, bookie_id, new_id)
    if running:
        refusals.append("registered as available (running): "
                        + ", ".join(f"{b} ({state})" for b, state in running.items())
                        + "; stop the bookie before changing its cookie")
    removed = [d for d in cookie_directories(old) if d not in cookie_directories(new)]
    if removed:
        refusals.append(f"directories would leave the cookie: {', '.join(removed)} (their data would no longer"
                        " be seen by the bookie)")
    if cfg is not None:
        conf_diff = new.differences(config_cookie(cfg.bookie_id, cfg.journal_dirs, cfg.ledger_dirs,
                                                  cfg.index_dir or None, new.instance_id))
        if conf_diff:
            refusals.append(f"{args.conf} does not describe the updated cookie ({'; '.join(conf_diff)}): change"
                            " the configuration first (advertised_address, bookie_port, directories)")
        refusals += await _check_directories(args, old, new)
    if refusals and not args.force:
        raise BKError(f"cookie of bookie {bookie_id} not changed: " + " | ".join(refusals) + " (--force overrides)")
    changes = _changes(old, new)
    fields = {"bookie_id": bookie_id, "new_bookie_id": new_id, "changed": bool(changes), "changes": changes,
              "old_cookie": _fields(old), "cookie": _fields(new), "directories_stamped": [],
              "forced": bool(refusals)}
    lines = [f"bookie {bookie_id}: " + ("; ".join(changes) if changes else "the cookie already says this")]

    if new_id != bookie_id:
        # the new znode first (a taken id stops everything), then the directories, then the old
        # znode (CAS: it must still be the cookie this update started from); a run cut short
        # in between is finished by running the same command again
        existing, _ = await _read_cookie(cookies, new_id)
        if existing is None:
            await cookies.write(new_id, new)
        elif existing.differences(new):
            raise BKError(f"bookie id {new_id} already has another cookie ({'; '.join(existing.differences(new))})")
    elif changes:
        try:
            await cookies.write(bookie_id, new, version)
        except MetadataVersionError:
            raise BKError(f"the cookie of bookie {bookie_id} changed while this command ran; nothing was"
                          " written: run it again") from None
    if cfg is not None:
        directories = cookie_directories(new)
        await asyncio.to_thread(lambda: [write_directory_cookie(d, new) for d in directories])
        fields["directories_stamped"] = directories
        lines.append(f"stamped {len(directories)} directories: {', '.join(directories)}")
    else:
        lines.append("directories NOT touched (no --conf): run this on the bookie's host with --conf FILE to"
                     " restamp them, or the bookie will refuse to start")
    if new_id != bookie_id:
        try:
            await cookies.delete(bookie_id, version)
        except MetadataVersionError:
            raise BKError(f"the old cookie of {bookie_id} changed while this command ran; the new one is at"
                          f" {cookies.paths.cookie(new_id)}: check with `cookie show` and delete the old one"
                          " by hand") from None
        lines.append(f"moved {cookies.paths.cookie(bookie_id)} -> {cookies.paths.cookie(new_id)}")
    return _result(args, fields, "\n".join(lines))


# ---------------------------------------------------------------- delete
async def _delete(store, args) -> dict:
    from bk.meta.cookie import CookieStore

    bookie_id = _bookie_id(args, None)
    running = (await _registration(store, bookie_id)).get(bookie_id)
    if running and not args.force:
        raise BKError(f"bookie {bookie_id} is registered as available ({running}): it is running, so its cookie"
                      " is not deleted; stop it first (or --force)")
    cookies = CookieStore(store)
    cookie, version = await _read_cookie(cookies, bookie_id)
    if cookie is None:
        raise BKError(f"bookie {bookie_id} has no cookie in ZooKeeper ({cookies.paths.cookie(bookie_id)})")
    try:
        await cookies.delete(bookie_id, version)
    except (MetadataVersionError, MetadataNotFoundError):
        raise BKError(f"the cookie of bookie {bookie_id} changed while this command ran; nothing was deleted:"
                      " run it again") from None
    fields = {"bookie_id": bookie_id, "deleted": True, "cookie": _fields(cookie), "zk_version": version,
              "was_registered": running}
    return _result(args, fields, f"deleted the cookie of bookie {bookie_id} ({cookies.paths.cookie(bookie_id)})")


# ---------------------------------------------------------------- generate
async def _generate(store, args) -> dict:
    from bk.meta.cluster import read_instance_id
    from bk.meta.cookie import config_cookie

    cfg = _config(args)
    bookie_id = _bookie_id(args, cfg)
    journal = _dirs(args.journal_dirs, "journal-dirs") or (tuple(cfg.journal_dirs) if cfg else None)
    ledger = _dirs(args.ledger_dirs, "ledger-dirs") or (tuple(cfg.ledger_dirs) if cfg else None)
    if journal is None or ledger is None:
        raise BKError("give the directories: --conf FILE, or --journal-dirs and --ledger-dirs")
    index = args.index_dir or (cfg.index_dir if cfg else "") or None
    instance_id = args.instance_id or await read_instance_id(store)
    cookie = config_cookie(bookie_id, journal, ledger, index, instance_id)
    text = cookie.to_text()
    fields = {"bookie_id": bookie_id, "cookie": _fields(cookie), "output": args.output}
    if args.output:
        if os.path.exists(args.output) and not args.force:
            raise BKError(f"{args.output} exists; --force overwrites it")
        try:
            with open(args.output, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as e:
            raise BKError(f"cannot write {args.output}: {e}") from None
        return _result(args, fields, f"wrote the cookie of bookie {bookie_id} to {args.output}")
    if args.json:
        fields["text_form"] = text
    return _result(args, fields, text.rstrip("\n"))



# ---------------------------------------------------------------- the command
def _dir_lists(new: str) -> tuple:
    return tuple(arg(f"--{kind}-dirs", metavar="D,..", help=f"{new}{kind} directories, comma-separated")
                 for kind in ("journal", "ledger"))


ACTIONS = (
    action("show", "print the cookie in ZooKeeper; with --conf also each directory's and whether they match",
           "Print BOOKIE_ID's cookie as ZooKeeper holds it and whether the bookie is registered. With"
           " --conf FILE (the bookie's configuration, on the bookie's host) also read current/VERSION in"
           " every journal, ledger and index directory and say, for each, whether it matches ZooKeeper's;"
           " and whether the configuration itself matches (what the bookie checks when it boots).",
           args=(arg("bookie_id", nargs="?", help="host:port (default: the one --conf describes)"),), fn=_show),
    action("update", "change a stopped bookie's address or directory list (ZooKeeper and directories)",
           "Rewrite the cookie of a STOPPED bookie. --new-bookie-id moves it to a new address: the cookie"
           " is created under the new id, the directories are restamped, and the old znode is deleted"
           " (BookKeeper's updatecookie -bookieId). A new directory list (--journal-dirs, --ledger-dirs,"
           " --index-dir, or --dirs-from-conf) replaces the one in the cookie; directories may be added"
           " (they must be empty) but not removed unless --force (the bookie would stop seeing their"
           " data). With --conf, run on the bookie's host: every directory of the new cookie is checked"
           " (it must hold the old or the new cookie, or be empty) and restamped, and the configuration"
           " must describe the new cookie. Without --conf only ZooKeeper changes, and the directories"
           " must be restamped later (run again with --conf on the bookie's host) or the bookie will"
           " refuse to start.",
           args=(arg("bookie_id", nargs="?", help="the bookie's current id, host:port (default: from --conf)"),
                 arg("--new-bookie-id", metavar="HOST:PORT", help="the bookie's new address"),
                 *_dir_lists("new "),
                 one_of(arg("--index-dir", metavar="D", help="new index directory (apart from the ledger dirs)"),
                        arg("--no-index-dir", action="store_true",
                            help="the index lives in the first ledger dir again")),
                 arg("--dirs-from-conf", action="store_true", help="take the new directory lists from --conf"),
                 arg("--force", action="store_true",
                     help="even while the bookie is registered, with removed directories, or with directories"
                          " or a configuration that do not agree")), fn=_update),
    action("delete", "delete a bookie's cookie from ZooKeeper (refused while it is registered)",
           "Delete BOOKIE_ID's cookie znode (its directories are not touched). Do this only for a bookie"
           " that is gone for good and whose ledgers have been re-replicated (`recover`): a bookie whose"
           " cookie is deleted refuses to start on its old directories. Refused while the bookie is"
           " registered as available (writable or read-only) unless --force.",
           args=(arg("bookie_id", help="host:port"),
                 arg("--force", action="store_true", help="delete even while the bookie is registered")),
           fn=_delete),
    action("generate", "print (or write to a file) the cookie a configuration implies; changes nothing",
           "Build the cookie a bookie with this configuration must have and print it in the stored text"
           " form, or write it to --output FILE. Nothing in ZooKeeper or in the bookie's directories is"
           " touched. Directories come from --conf or --journal-dirs/--ledger-dirs/--index-dir; the"
           " instance id from --instance-id or the cluster's INSTANCEID znode.",
           args=(arg("bookie_id", nargs="?", help="host:port (default: the one --conf describes)"),
                 *_dir_lists(""),
                 arg("--index-dir", metavar="D", help="index directory, if apart from the ledger dirs"),
                 arg("--instance-id", metavar="ID", help="default: the cluster's INSTANCEID"),
                 arg("--output", "-o", metavar="FILE", help="write the cookie text here instead of printing it"),
                 arg("--force", action="store_true", help="overwrite --output FILE if it exists")),
           fn=_generate),
)


@command("cookie", help="show, update, delete or generate a bookie's cookie", description=__doc__,
         raw_description=True, actions=ACTIONS)
async def cmd_cookie(uri: str, args) -> dict:
    from bk.meta import open_store
    store = await open_store(uri)
    try:
        return await {a.name: a.fn for a in ACTIONS}[args.cookie_command](store, args)
    finally:
        await store.close()
