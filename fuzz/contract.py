"""What every fuzz target asserts, in one place: the parser's result or its documented error.

A target is `fn(data: bytes) -> None`. It calls parsers on `data`, lets the errors their
docstrings promise pass (`allowed`), and turns anything else into a failure: an exception
of another type escapes (atheris reports it as a crash, the suite's replay as a test
failure), and a twin disagreement or a broken invariant raises ContractError.

Twins: a native kernel and its pure-Python twin must give equal results on every input
(the same value, or an exception of the same type). `twins(name)` loads both whatever
BK_NO_NATIVE says; a kernel that was not built is compared with nobody, unless
BK_REQUIRE_NATIVE=1, which makes that an error.
"""
from __future__ import annotations

import os
from contextlib import contextmanager

from bk import _native


class ContractError(AssertionError):
    """A parser broke its contract on a fuzz input (wrong result, twins disagree, invariant)."""


def check(cond: bool, what: str) -> None:
    if not cond:
        raise ContractError(what)


@contextmanager
def allowed(*errors: type[BaseException]):
    """Run a parse whose documented failures are `errors`; anything else propagates."""
    try:
        yield
    except errors:
        pass


def params(data: bytes, n: int) -> tuple[list[int], bytes]:
    """The first n bytes as small parameters (0..255; 0 when the input is shorter), and the rest."""
    head = list(data[:n]) + [0] * max(0, n - len(data))
    return head, data[n:]


class Twins:
    """One kernel's native and pure modules; `same(fn, *args)` runs both and compares."""

    def __init__(self, name: str, package: str = "bk._native"):
        self.name = name
        self.pure = _native.load_pure(name, package)
        self.native = _native.load_native(name, package)
        if self.native is None and os.environ.get("BK_REQUIRE_NATIVE", "").strip() in ("1", "true", "yes"):
            raise ImportError(f"native kernel {package}._{name} is not built and BK_REQUIRE_NATIVE=1")

    def same(self, fn: str, *args, normalize=lambda r: r):
        """Pure's result of kernel function `fn`; ContractError when native differs.
        An exception is part of the result: both must raise the same type (re-raised)."""
        pure = _outcome(getattr(self.pure, fn), args, normalize)
        if self.native is not None:
            native = _outcome(getattr(self.native, fn), args, normalize)
            if pure != native:
                raise ContractError(f"{self.name}.{fn}: native {native!r:.300} != pure {pure!r:.300}")
        kind, value = pure
        if kind == "raise":
            raise value[1]
        return value


def _outcome(fn, args, normalize):
    try:
        return "ok", normalize(fn(*args))
    except (ValueError, TypeError, OverflowError, IndexError) as e:
        # the exception object itself is kept for re-raising; equality is on the type
        return "raise", _Raised(type(e), e)
    # anything else (MemoryError, SystemError, a segfault) is no documented kernel error


class _Raised(tuple):
    def __new__(cls, kind, exc):
        return tuple.__new__(cls, (kind, exc))

    def __eq__(self, other):
        return isinstance(other, _Raised) and self[0] is other[0]

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash(self[0])

    def __repr__(self):
        return f"raise {self[0].__name__}({self[1]})"


def plain(value):
    """Results made comparable across twins: record tuples to tuples, buffers to bytes."""
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return value


def error_fields(e: BaseException) -> tuple:
    """An error item (RequestDecodeError and kin are returned in place of messages) as a value."""
    return (type(e).__name__, str(e), getattr(e, "code", None), getattr(e, "op", None),
            getattr(e, "ledger_id", None), getattr(e, "entry_id", None))


def item_value(item):
    """A decoded item (message, error instance or (offset, length)) as a comparable value."""
    if isinstance(item, BaseException):
        return error_fields(item)
    if isinstance(item, tuple):
        return (type(item).__name__, plain(tuple(item)))
    return plain(item)
