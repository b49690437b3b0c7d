"""The v2 wire layouts live in bk/formats/wire.py (one leaf package for every byte layout).

This name stays for the upper layers' callers not yet moved (bk/server/*, bk/bookie/bookie.py,
bk/cli/*); new code imports `bk.formats.wire`.
"""
from bk.formats.wire import *  # noqa: F401,F403
