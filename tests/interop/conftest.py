"""tests/interop: fixtures (interop_support.py has them and every helper; docs/INTEROP.md says what runs)."""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from interop_support import interop_zk  # noqa: E402,F401  (a session fixture)
