"""ZooKeeper digest authentication and CREATOR_ALL ACLs on bk's znodes (real ZooKeeper)."""
import os

import pytest

from bk import eventloop
from bk.errors import MetadataStoreError
from bk.meta import open_store
from bk.meta.cluster import MetadataPaths
from bk.testing.cluster import LocalCluster

pytestmark = pytest.mark.integration


def test_znodes_created_with_security_need_the_credentials(zk_metadata_uri):
    async def main():
        owner = await open_store(zk_metadata_uri, zk_digest_auth="bk:s3cret", zk_enable_security=True)
        same = await open_store(zk_metadata_uri, zk_digest_auth="bk:s3cret")
        anonymous = await open_store(zk_metadata_uri, zk_digest_auth=None)
        wrong = await open_store(zk_metadata_uri, zk_digest_auth="bk:guess")
        try:
            path = owner.ledgers_root + "/guarded"
            await owner.create(path, b"data", make_parents=True)
            assert (await same.get(path))[0] == b"data"
            for other in (anonymous, wrong):
                with pytest.raises(MetadataStoreError, match="not authorized"):
                    await other.get(path)
                with pytest.raises(MetadataStoreError, match="not authorized"):
                    await other.set(path, b"x")
            await same.set(path, b"changed")
        finally:
            for s in (owner, same, anonymous, wrong):
                await s.close()
    eventloop.run(main())


def test_a_secured_bookie_guards_its_znodes(zk_server, tmp_path):
    secret = tmp_path / "zk.digest"
    secret.write_text("bookie:pw\n")
    c = LocalCluster(str(tmp_path / "c"), bookies=1, zk_connect=f"{zk_server}/sec-{os.getpid()}",
                     zk_digest_auth_path=str(secret), zk_enable_security=True)
    c.start()
    try:
        async def main():
            from bk.client import BookKeeper
            anonymous = await open_store(c.metadata_uri, zk_digest_auth=None)
            try:
                cookie = MetadataPaths(anonymous.ledgers_root).cookie(c.bookie_ids[0])
                with pytest.raises(MetadataStoreError, match="not authorized"):
                    await anonymous.get(cookie)
            finally:
                await anonymous.close()
            opts = {"zk_digest_auth": "bookie:pw", "zk_enable_security": True}
            async with BookKeeper(c.metadata_uri, store_options=opts) as bk:
                lh = await bk.create_ledger(1, 1, 1, password=b"pw")
                await lh.add_entry(b"x")
                await lh.close()
        eventloop.run(main())
    finally:
        c.stop()
