"""The bookie's admin channel: JSON lines over a Unix-domain socket (docs/GC.md).

Why a Unix socket: `bk shell triggergc` must reach a running bookie without the
HTTP admin server, and GC is a destructive control. A socket file under the
bookie's own ledger dir (default `<first ledger dir>/admin.sock`, mode 0600) is
reachable only by who may read the bookie's data anyway, needs no port, and does
not exist on any network. `admin_socket_path` moves it; `admin_socket_enabled =
false` turns it off.

Protocol: the client sends ONE request line and reads ONE response line, then
the connection closes.
    request   {"op": "<name>", ...arguments}
    response  {"ok": true, "result": {...}}  or  {"ok": false, "error": "..."}
Ops (each calls the bookie's Python API, which a later HTTP endpoint can call too):
    gc_trigger   {"force_major": bool, "force_minor": bool}  -> GarbageCollector.trigger()
    gc_status    {}                                           -> GarbageCollector.status()
    entry_logs   {}                                           -> GarbageCollector.entry_log_usage()
    gc_compact_logs {"log_ids": [int, ...]}                   -> GarbageCollector.compact_logs()
                 (a compaction plan: `bk shell compact --plan`, docs/ANALYTICS.md)
    expire_metadata_session {}  -> the ZooKeeper server expires the bookie's session (a fault
                 drill: the bookie must register again; the chaos runner's zk-expire on real
                 bookie processes). Answers with the old and new session ids.
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import socket
import stat
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 1 << 20
MAX_UNIX_PATH_BYTES = 107  # sun_path is 108 bytes with its NUL


class AdminError(Exception):
    """The admin channel could not be reached or answered with an error."""


class GcCalls:
    """GC and compaction asked for from the admin surface (HTTP, the admin socket) wait on
    ONE thread of their own, never on the default executor: a caller of trigger() or
    compact_logs() is held for a whole pass, and the default executor serves the read path.
    One thread is enough: the collector runs one pass at a time and requests made during a
    pass share the next one (bk.bookie.gc)."""

    def __init__(self, gc):
        self.gc = gc
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="bk-gc-admin")
        self._lock = threading.Lock()
        self._pending: set[Future] = set()  # background triggers whose pass has not ended

    async def call(self, fn, *args, **kwargs):
        """fn(*args, **kwargs) on the GC executor, awaited."""
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, functools.partial(fn, *args, **kwargs))

    def trigger_in_background(self, force_major: bool = False, force_minor: bool = False) -> None:
        """Ask for a pass and return at once (BookKeeper's HTTP GC trigger); the pass's
        figures go to the log and to the collector's status (gc_details)."""
        fut = self.executor.submit(self.gc.trigger, force_major=force_major, force_minor=force_minor)
        with self._lock:
            self._pending.add(fut)
        fut.add_done_callback(self._ended)

    def _ended(self, fut: Future) -> None:
        with self._lock:
            self._pending.discard(fut)
        try:
            result = fut.result()
        except Exception:
            log.exception("GC pass triggered over HTTP failed")
            return
        if isinstance(result, dict) and not result.get("ok", True):
            log.warning("GC pass triggered over HTTP: %s", result.get("error", result))

    def in_force(self) -> bool:
        """A pass is running, or one asked for here has not ended yet (it may still wait
        for the collector's thread to pick it up)."""
        with self._lock:
            if any(not f.done() for f in self._pending):
                return True
        return bool(self.gc.status().get("running"))


_GC_CALLS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_GC_CALLS_LOCK = threading.Lock()


def gc_calls(gc) -> GcCalls:
    """The one GcCalls of a GarbageCollector (shared by the HTTP server and the admin socket)."""
    with _GC_CALLS_LOCK:
        calls = _GC_CALLS.get(gc)
        if calls is None:
            calls = _GC_CALLS[gc] = GcCalls(gc)
        return calls


def gc_ops(gc) -> dict:
    """op name -> blocking handler(args) for a GarbageCollector (run off the loop). Handlers
    that wait for a pass carry `executor`: the GC's own (GcCalls), where _serve runs them."""
    def trigger(a):
        return gc.trigger(force_major=bool(a.get("force_major")), force_minor=bool(a.get("force_minor")))

    def compact(a):
        return gc.compact_logs(_log_ids(a.get("log_ids")))

    trigger.executor = compact.executor = gc_calls(gc).executor
    return {
        "gc_trigger": trigger,
        "gc_status": lambda a: gc.status(),
        "entry_logs": lambda a: {"entry_logs": gc.entry_log_usage()},
        "gc_compact_logs": compact,
    }


def metadata_ops(store, loop: asyncio.AbstractEventLoop, timeout_s: float = 60.0) -> dict:
    """op name -> blocking handler(args) acting on the bookie's metadata store (on `loop`)."""
    def expire(_args) -> dict:
        old = getattr(store, "session_id", None)
        asyncio.run_coroutine_threadsafe(store.expire_session(), loop).result(timeout_s)
        return {"old_session_id": old, "session_id": getattr(store, "session_id", None)}

    return {"expire_metadata_session": expire}


def _log_ids(value) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                              for i in value):
        raise ValueError("log_ids must be a list of non-negative integers")
    return value


class AdminServer:
    def __init__(self, path: str, ops: dict):
        self.path = path
        self.ops = ops
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> bool:
        """Listen; False (logged) when the path cannot hold a socket."""
        if len(os.fsencode(self.path)) > MAX_UNIX_PATH_BYTES:
            log.error("admin socket disabled: %s is longer than %d bytes (set admin_socket_path)",
                      self.path, MAX_UNIX_PATH_BYTES)
            return False
        self._remove_stale()
        self._server = await asyncio.start_unix_server(self._serve, path=self.path, limit=MAX_LINE_BYTES)
        os.chmod(self.path, 0o600)
        log.info("admin socket %s", self.path)
        return True

    def _remove_stale(self) -> None:
        """A socket file left by a killed bookie is removed; one that answers is not ours."""
        try:
            mode = os.lstat(self.path).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(mode):
            raise AdminError(f"{self.path} exists and is not a socket")
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(self.path)
            except OSError:
                os.unlink(self.path)
                return
        raise AdminError(f"another process is serving the admin socket {self.path}")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                line = await reader.readline()
                req = json.loads(line)
                if not isinstance(req, dict):
                    raise ValueError("a request is a JSON object")
                op = self.ops.get(req.get("op"))
                if op is None:
                    raise ValueError(f"unknown op {req.get('op')!r}; known: {sorted(self.ops)}")
                # None: the default executor; a GC pass waits on the GC's own (gc_ops)
                result = await asyncio.get_running_loop().run_in_executor(
                    getattr(op, "executor", None), op, req)
                reply = {"ok": True, "result": result}
            except (ValueError, asyncio.LimitOverrunError) as e:
                reply = {"ok": False, "error": f"bad request: {e}"}
            except Exception as e:  # the channel answers every request
                log.exception("admin request failed")
                reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            writer.write(json.dumps(reply, default=str).encode() + b"\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def admin_call(path: str, op: str, timeout_s: float = 600.0, **args) -> dict:
    """One request to a bookie's admin socket (blocking); the result, or AdminError."""
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(timeout_s)
            s.connect(path)
            s.sendall(json.dumps({"op": op, **args}).encode() + b"\n")
            chunks = []
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                if chunk.endswith(b"\n"):
                    break
    except FileNotFoundError:
        raise AdminError(f"no admin socket at {path}: is the bookie running (admin_socket_enabled)?") from None
    except ConnectionRefusedError:
        raise AdminError(f"nothing listens on {path}: the bookie is not running") from None
    except socket.timeout:
        raise AdminError(f"no answer from {path} within {timeout_s}s") from None
    except OSError as e:
        raise AdminError(f"admin socket {path}: {e.strerror or e}") from None
    try:
        reply = json.loads(b"".join(chunks))
    except ValueError:
        raise AdminError(f"bad answer from {path}") from None
    if not reply.get("ok"):
        raise AdminError(reply.get("error", "unknown error"))
    return reply["result"]
