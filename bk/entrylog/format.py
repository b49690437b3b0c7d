"""The entry-log byte formats live in bk/formats/entrylog.py (one leaf package for every layout).

This name stays for the callers not yet moved (bk/cli/*, bk/server/http_handlers.py) and for
readers of older notes; new code imports `bk.formats.entrylog`.
"""
from bk.formats.entrylog import *  # noqa: F401,F403
from bk.formats.entrylog import HeaderError, LogHeader  # noqa: F401

HEADER_BYTES = LOG_HEADER_BYTES  # noqa: F405  bk/cli/shell_local.py's name; prefer LOG_HEADER_BYTES
