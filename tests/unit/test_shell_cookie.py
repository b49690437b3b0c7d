"""`bk shell cookie` actions in-process on the in-memory store: the compare-and-set paths a
subprocess test cannot time (someone else changes the cookie between the read and the write),
and a rename cut short between its steps, finished by running it again."""
from __future__ import annotations

import argparse
import pathlib
import sys
import uuid

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from test_client_support import run_async  # noqa: E402

from bk.cli import shell_cookie  # noqa: E402
from bk.errors import BKError  # noqa: E402
from bk.meta import open_store  # noqa: E402
from bk.meta.cluster import init_new_cluster  # noqa: E402
from bk.meta.cookie import Cookie, CookieStore  # noqa: E402

OLD, NEW = "10.0.0.1:3181", "10.0.0.2:3181"


def update_args(bookie_id: str, **options) -> argparse.Namespace:
    base = dict(bookie_id=bookie_id, new_bookie_id=None, journal_dirs=None, ledger_dirs=None, index_dir=None,
                no_index_dir=False, dirs_from_conf=False, force=False, conf=None, json=True)
    return argparse.Namespace(**{**base, **options})


async def cluster_with_cookie():
    store = await open_store(f"mem://cookie-{uuid.uuid4().hex[:10]}/ledgers")
    instance = await init_new_cluster(store)
    cookies = CookieStore(store)
    await cookies.write(OLD, Cookie(OLD, ("/j",), ("/l",), instance))
    return store, cookies


class Interfering:
    """A CookieStore whose next write/delete of `bookie_id` is preceded by someone else's change."""

    def __init__(self, cookies: CookieStore, bookie_id: str):
        self.cookies, self.bookie_id = cookies, bookie_id
        self.real_write, self.real_delete = cookies.write, cookies.delete

    async def _bump(self):
        cookie, version = await self.cookies.read(self.bookie_id)
        await self.real_write(self.bookie_id, Cookie(cookie.bookie_host, ("/other",), cookie.ledger_dirs,
                                                     cookie.instance_id), version)

    async def write(self, bookie_id, cookie, version=None):
        if bookie_id == self.bookie_id and version is not None:
            await self._bump()
        return await self.real_write(bookie_id, cookie, version)

    async def delete(self, bookie_id, version=-1):
        if bookie_id == self.bookie_id:
            await self._bump()
        return await self.real_delete(bookie_id, version)


@pytest.mark.parametrize("action", ["update", "rename", "delete"])
@run_async
async def test_a_cookie_changed_meanwhile_is_not_overwritten(action, monkeypatch):
    store, cookies = await cluster_with_cookie()
    try:
        spy = Interfering(cookies, OLD)
        monkeypatch.setattr(CookieStore, "write", lambda self, *a: spy.write(*a))
        monkeypatch.setattr(CookieStore, "delete", lambda self, *a: spy.delete(*a))
        if action == "update":
            run, args = shell_cookie._update, update_args(OLD, ledger_dirs="/l,/l2")
        elif action == "rename":
            run, args = shell_cookie._update, update_args(OLD, new_bookie_id=NEW)
        else:
            run, args = shell_cookie._delete, argparse.Namespace(bookie_id=OLD, force=False, json=True)
        with pytest.raises(BKError, match="changed while this command ran"):
            await run(store, args)
        monkeypatch.undo()
        cookie, version = await cookies.read(OLD)
        assert cookie.journal_dirs == ("/other",) and version == 1  # the other change stands, alone
    finally:
        await store.close()


@run_async
async def test_a_rename_cut_short_is_finished_by_running_it_again(monkeypatch):
    store, cookies = await cluster_with_cookie()
    try:
        async def crash(self, bookie_id, version=-1):
            raise BKError("crashed before deleting the old cookie")

        monkeypatch.setattr(CookieStore, "delete", crash)
        with pytest.raises(BKError, match="crashed"):
            await shell_cookie._update(store, update_args(OLD, new_bookie_id=NEW))
        monkeypatch.undo()
        assert (await cookies.read(NEW))[0].bookie_host == NEW and (await cookies.read(OLD))[0].bookie_host == OLD
        done = await shell_cookie._update(store, update_args(OLD, new_bookie_id=NEW))
        assert done["new_bookie_id"] == NEW and "text" not in done
        assert (await cookies.read(NEW))[0].journal_dirs == ("/j",)
        with pytest.raises(BKError, match="has no cookie"):
            await shell_cookie._show(store, argparse.Namespace(bookie_id=OLD, conf=None, json=True))
        # a rename onto an id that has another cookie is refused
        await cookies.write(OLD, Cookie(OLD, ("/x",), ("/y",), None))
        with pytest.raises(BKError, match="already has another cookie"):
            await shell_cookie._update(store, update_args(OLD, new_bookie_id=NEW))
    finally:
        await store.close()
