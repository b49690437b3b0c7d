"""`bk bookie` raises its soft open-files limit to the hard one at start (issue 17)."""
import logging
import resource

from bk.cli.bookie import raise_open_files_limit


def test_soft_limit_raised_to_the_hard_limit_and_logged(caplog):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = 256 if hard == resource.RLIM_INFINITY else min(256, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        with caplog.at_level(logging.INFO, logger="bk.bookie"):
            got_soft, got_hard = raise_open_files_limit()
        now_soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        assert got_hard == hard and now_soft == got_soft
        if hard != resource.RLIM_INFINITY:
            assert now_soft == hard
        assert now_soft > low or hard == low
        assert f"open-files limit {now_soft}" in caplog.text
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
