"""Builds the Cython byte kernels in bk/_native.

Every kernel has a pure-Python twin, so a failed build leaves a working (slower)
package; BK_REQUIRE_NATIVE=1 turns a missing build into an error at import time.
"""
import glob
import os
import runpy

from setuptools import setup

# bk/_native/wire_layout.pxi is generated from the one layout module (bk/proto/layout.py).
_HERE = os.path.dirname(os.path.abspath(__file__))
_layout = runpy.run_path(os.path.join(_HERE, "bk", "proto", "layout.py"))
_pxi = os.path.join(_HERE, "bk", "_native", "wire_layout.pxi")
if not os.path.exists(_pxi) or open(_pxi).read() != _layout["pxi_text"]():
    with open(_pxi, "w") as fh:
        fh.write(_layout["pxi_text"]())

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
    ext_modules = cythonize(
        extensions,
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False},
        quiet=True,
    )
except ImportError:  # Cython missing: the pure twins serve
    pass

setup(ext_modules=ext_modules)
