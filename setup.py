"""Builds the Cython byte kernels in bk/_native.

Every kernel has a pure-Python twin, so a failed build leaves a working (slower)
package; BK_REQUIRE_NATIVE=1 turns a missing build into an error at import time.
"""
import glob
import os
import sys

from setuptools import setup

# bk/_native/formats.pxi is generated from the one layout package (bk/formats: it imports
# nothing else from bk, so it loads before anything is built).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
from bk.formats import pxi as _pxi_gen  # noqa: E402

_pxi = os.path.join(_HERE, *_pxi_gen.PXI_PATH)
if not os.path.exists(_pxi) or open(_pxi).read() != _pxi_gen.pxi_text():
    with open(_pxi, "w") as fh:
        fh.write(_pxi_gen.pxi_text())



def _find_liburing() -> str | None:
    if not os.path.exists("/usr/include/liburing.h"):
        return None
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"):
        if os.path.exists(os.path.join(d, "liburing.a")):
            return os.path.join(d, "liburing.a")
    return None


ext_modules = []
try:
    from Cython.Build import cythonize
    from setuptools import Extension

    # bk/_native: byte kernels; bk/client/_core.pyx: the client's add path
    sources = sorted(glob.glob(os.path.join("bk", "_native", "*.pyx")) + glob.glob(os.path.join("bk", "client", "*.pyx")))
    extensions = [
        Extension(
            os.path.splitext(src)[0].replace(os.sep, "."),
            [src],
            include_dirs=[os.path.join("bk", "_native")],
            extra_compile_args=["-O3"],
        )
        for src in sources
    ]
    # bk/bookie/_ring.pyx: the bookie's io_uring reads, linked with liburing's static library
    # (Debian: liburing-dev, installed by scripts/setup). Without it the bookie reads through
    # its read threads, so a missing liburing is no build error.
    _liburing = _find_liburing()
    if _liburing is not None:
        extensions.append(Extension("bk.bookie._ring", [os.path.join("bk", "bookie", "_ring.pyx")],
                                    extra_objects=[_liburing], extra_compile_args=["-O3"]))
    ext_modules = cythonize(
        extensions,
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False},
        quiet=True,
    )
except ImportError:  # Cython missing: the pure twins serve
    pass

setup(ext_modules=ext_modules)
