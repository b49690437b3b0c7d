"""The HTTP admin server: BookKeeper's admin REST API and /metrics, in the bookie.

An aiohttp application on the bookie's own event loop, started and stopped by
BookieServer (settings http_server_*; docs/OPERATIONS.md lists the endpoints).
It serves the routes it is handed: a list of Route(path, methods, handler), the bookie's
being bk.server.http_routes.ROUTES (handlers in bk.server.http_handlers and
bk.server.http_ops); a handler is `async def handler(admin, request) -> web.Response`.
This module imports none of them: it is the server and the helpers they share.

Rules kept here for every endpoint:
- errors are JSON `{"error": "...", "status": N}`: an unknown path 404, a method
  the path does not take 405 (with Allow), a bad parameter 400, a missing ledger
  404, mutations disabled 403, a missing or wrong token 401, anything else 500;
  no handler's failure reaches the bookie;
- nothing blocks the loop: metadata goes through bk.meta's async API, files and
  statvfs through the admin's own one-thread executor (`run_blocking`, never the
  default executor the read path uses); an answer that can be large (ledger/list,
  entry_log_usage) is paged with BookKeeper's `page` parameter (PAGE_SIZE items a
  page, as its LIST_LEDGER_BATCH_SIZE) and streamed as compact JSON a chunk at a
  time (JsonStream), the loop serving adds between chunks;
- PUT/POST/DELETE (the mutating methods) answer 403 unless
  http_server_mutations_enabled; with http_server_token set, every endpoint but
  the probes (/heartbeat, /api/v1/bookie/is_ready) and /metrics needs
  `Authorization: Bearer <token>`.

Safe by default: the server listens on 127.0.0.1 unless http_server_address is
set, and bk.config refuses an address beyond loopback with neither a token nor
mutual TLS (http_server_tls_enable + tls_client_authentication), so ledger data
never reaches the network unauthenticated. A port another process holds is a
WARNING and no HTTP server: the bookie itself serves (two bookies on one host
with default settings both start; the second has no admin API until it is given
its own http_server_port).
"""
from __future__ import annotations

import asyncio
import errno
import hmac
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, NamedTuple

from aiohttp import web

from bk.errors import BKError, IncorrectParameterError, NoSuchLedgerError, NoSuchLedgerMetadataError

log = logging.getLogger(__name__)

MUTATING = frozenset({"PUT", "POST", "DELETE"})
OPEN_PATHS = frozenset({"/heartbeat", "/api/v1/bookie/is_ready", "/metrics"})
PAGE_SIZE = 100  # items a page of a paged answer (BookKeeper's ListLedgerService.LIST_LEDGER_BATCH_SIZE)
STREAM_FLUSH_BYTES = 64 * 1024  # a streamed answer is written (and the loop yields) every this many bytes


class Route(NamedTuple):
    """`handler` answers `methods` on `path` (and on `path/`)."""
    path: str
    methods: tuple
    handler: Callable


def route_table(routes) -> dict[str, dict[str, Callable]]:
    """path -> {method: handler}; a path and method given twice is an error, not a silent override."""
    table: dict[str, dict[str, Callable]] = {}
    for r in routes:
        for method in r.methods:
            if method in table.setdefault(r.path, {}):
                raise ValueError(f"HTTP route {method} {r.path} is given twice")
            table[r.path][method] = r.handler
    return table


class HttpError(Exception):
    """An answer with a status code and a JSON error body."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def json_response(body, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=lambda o: json.dumps(o, indent=2, default=str))


def error_response(status: int, message: str, **headers: str) -> web.Response:
    resp = json_response({"error": message, "status": status}, status=status)
    resp.headers.update(headers)
    return resp


# ---------------------------------------------------------------- parameters
def param_int(request: web.Request, name: str, default: int | None = None, *, lowest: int | None = None) -> int:
    """A query parameter as an int; 400 when absent (and no default) or not an int."""
    text = request.query.get(name)
    if text is None or text == "":
        if default is None:
            raise HttpError(400, f"missing parameter {name}")
        return default
    try:
        value = int(text)
    except ValueError:
        raise HttpError(400, f"parameter {name} must be an integer, got {text!r}") from None
    if lowest is not None and value < lowest:
        raise HttpError(400, f"parameter {name} must be at least {lowest}, got {value}")
    return value


def param_bool(request: web.Request, name: str, default: bool = False) -> bool:
    text = request.query.get(name)
    if text is None or text == "":
        return default
    low = text.strip().lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off"):
        return False
    raise HttpError(400, f"parameter {name} must be true or false, got {text!r}")


def param_page(request: web.Request) -> int | None:
    """BookKeeper's `page` (1 = the first PAGE_SIZE items); None when absent (everything)."""
    return param_int(request, "page", 0, lowest=1) or None


def page_slice(items: list, page: int | None) -> list:
    if page is None:
        return items
    return items[(page - 1) * PAGE_SIZE:page * PAGE_SIZE]


class JsonStream:
    """A JSON answer written piece by piece: each piece is encoded on its own (compact, as
    BookKeeper's JsonUtil writes) and the loop yields every STREAM_FLUSH_BYTES, so a large
    answer never holds the loop that serves adds for more than one piece's encoding.
    Headers are sent at the first flush: a failure after that cannot become a JSON error,
    so `abort()` cuts the connection (the client sees a truncated transfer, never a
    well-formed partial answer)."""

    def __init__(self, request: web.Request):
        self.request = request
        self.response = web.StreamResponse(headers={"Content-Type": "application/json; charset=utf-8"})
        self._parts: list[str] = []
        self._size = 0
        self._first = [True]  # one flag per open object/array: no comma before its first member

    async def write(self, text: str) -> None:
        self._parts.append(text)
        self._size += len(text)
        if self._size >= STREAM_FLUSH_BYTES:
            await self.flush()

    async def flush(self) -> None:
        if not self.response.prepared:
            await self.response.prepare(self.request)
        if self._parts:
            data, self._parts, self._size = "".join(self._parts).encode(), [], 0
            if self.request.method != "HEAD":  # HEAD: the headers alone (a body would corrupt the connection)
                await self.response.write(data)
        await asyncio.sleep(0)  # the adds waiting on the loop go first

    async def open(self, bracket: str) -> None:
        await self.write(bracket)
        self._first.append(True)

    async def close(self, bracket: str) -> None:
        self._first.pop()
        await self.write(bracket)

    def _comma(self) -> str:
        if self._first[-1]:
            self._first[-1] = False
            return ""
        return ","

    async def key(self, name: str) -> None:
        """Start member `name` of the open object (its value written next)."""
        await self.write(self._comma() + json.dumps(name) + ":")

    async def members(self, mapping: dict) -> None:
        """Every member of `mapping` into the open object."""
        if mapping:
            await self.write(self._comma() + json.dumps(mapping, default=str)[1:-1])

    async def items(self, values: list) -> None:
        """Every value of `values` into the open array, each encoded on its own (one entry
        log's usage row can name a thousand ledgers: a list of them at once would not be)."""
        for value in values:
            await self.write(self._comma() + json.dumps(value, default=str))

    async def finish(self) -> web.StreamResponse:
        await self.flush()
        await self.response.write_eof()
        return self.response

    def abort(self) -> None:
        if self.request.transport is not None:
            self.request.transport.abort()


async def stream_json(request: web.Request, body: dict | list) -> web.StreamResponse:
    """A dict or list already in memory but possibly large, streamed PAGE_SIZE members at a time."""
    out = JsonStream(request)
    if isinstance(body, dict):
        await out.open("{")
        keys = list(body)
        for start in range(0, len(keys), PAGE_SIZE):
            await out.members({k: body[k] for k in keys[start:start + PAGE_SIZE]})
        await out.close("}")
    else:
        await out.open("[")
        await out.items(body)
        await out.close("]")
    return await out.finish()


async def json_body(request: web.Request) -> dict:
    """The request body as a JSON object ({} when empty); 400 when it is not one."""
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise HttpError(400, f"the body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise HttpError(400, "the body must be a JSON object")
    return body


# ---------------------------------------------------------------- the server
class HttpAdminServer:
    """Serves `routes` (Route rows; the bookie's: bk.server.http_routes.ROUTES) for one
    BookieServer (`self.server`)."""

    def __init__(self, server, config, routes):
        self.routes = route_table(routes)
        self.server = server
        self.config = config
        self.port: int | None = None  # None once start() found the port taken (no HTTP server)
        self.address = config.http_server_address or "127.0.0.1"
        self.scheme = "https" if config.http_server_tls_enable else "http"
        self._runner: web.AppRunner | None = None
        self._client = None  # a bk.client.BookKeeper, made on first use (ledger reads, recovery)
        self._client_lock = asyncio.Lock()
        self.tasks: dict[str, asyncio.Task] = {}  # background operations (recovery, decommission)
        # Files and statvfs for the admin API: one thread of its own, so a slow answer
        # (300 entry logs read) never takes a default-executor thread from the read path.
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="bk-http-admin")

    @property
    def url(self) -> str:
        host = self.config.advertised_address if self.address in ("", "0.0.0.0", "::") else self.address
        return f"{self.scheme}://{host}:{self.port}"

    def _ssl_context(self):
        """The bookie's TLS files as an HTTPS context (read once at start; CERT_REQUIRED
        with tls_client_authentication, so every request then carries a trusted certificate)."""
        if not self.config.http_server_tls_enable:
            return None
        from .tls import ServerTls
        return ServerTls(self.config).context()

    async def start(self) -> "HttpAdminServer | None":
        """Listen; None (with a WARNING) when another process holds the port."""
        ssl_context = self._ssl_context()  # bad TLS files: a ConfigError before anything listens
        app = web.Application(middlewares=[self._guard], client_max_size=1 << 20)
        for path in self.routes:  # BookKeeper's docs write some paths with a trailing slash: take both
            app.router.add_route("*", path, self._dispatch)
            app.router.add_route("*", path + "/", self._dispatch)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.address, self.config.http_server_port, reuse_address=True,
                           ssl_context=ssl_context)
        try:
            await site.start()
        except OSError as e:
            await self._runner.cleanup()
            self._runner = None
            if e.errno == errno.EADDRINUSE:
                log.warning("HTTP admin server DISABLED: %s:%d is in use by another process (another bookie?);"
                            " this bookie serves without its admin API and /metrics: give it its own"
                            " http_server_port (0 = any free port)", self.address, self.config.http_server_port)
                return None
            raise BKError(f"HTTP admin server cannot listen on {self.address}:{self.config.http_server_port}"
                          f" ({e.strerror or e}); set http_server_port (0 = any free port) or"
                          f" http_server_enabled = false") from None
        self.port = site._server.sockets[0].getsockname()[1]
        log.info("HTTP admin server on %s", self.url)
        return self

    async def stop(self) -> None:
        for task in list(self.tasks.values()):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        self.tasks.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        client, self._client = self._client, None
        if client is not None:
            await client.close()
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def run_blocking(self, fn, *args):
        """fn(*args) on the admin's own thread, awaited."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def client(self):
        """The admin's own BookKeeper client (own metadata session), started once."""
        async with self._client_lock:
            if self._client is None:
                from bk.client import BookKeeper
                self._client = await BookKeeper.for_bookie(self.config).start()
            return self._client

    def spawn(self, name: str, coro) -> bool:
        """Run an operation in the background unless one of that name runs; False if it does."""
        running = self.tasks.get(name)
        if running is not None and not running.done():
            coro.close()
            return False
        task = asyncio.ensure_future(coro)
        self.tasks[name] = task

        def finished(t: asyncio.Task) -> None:
            if not t.cancelled() and t.exception() is not None:
                log.error("HTTP admin operation %s failed: %s", name, t.exception())
            elif not t.cancelled():
                log.info("HTTP admin operation %s done: %s", name, t.result())
        task.add_done_callback(finished)
        return True

    # ------------------------------------------------------------ request path
    @web.middleware
    async def _guard(self, request: web.Request, handler):
        """Auth and every error to a JSON answer; nothing escapes to aiohttp or the bookie."""
        try:
            token = self.config.http_server_token
            if token and request.path not in OPEN_PATHS:
                given = request.headers.get("Authorization", "")
                if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                    return error_response(401, "a valid 'Authorization: Bearer <token>' header is required",
                                          **{"WWW-Authenticate": "Bearer"})
            return await handler(request)
        except HttpError as e:
            return error_response(e.status, str(e))
        except web.HTTPException as e:  # aiohttp's own: unknown path, body too large
            if e.status >= 400:
                return error_response(e.status, e.reason)
            raise
        except (NoSuchLedgerMetadataError, NoSuchLedgerError) as e:
            return error_response(404, str(e))
        except IncorrectParameterError as e:
            return error_response(400, str(e))
        except BKError as e:
            return error_response(500, f"{type(e).__name__}: {e}")
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a handler's bug answers 500, the bookie goes on
            log.exception("HTTP admin %s %s failed", request.method, request.path)
            return error_response(500, f"internal error: {type(e).__name__}: {e}")

    async def _dispatch(self, request: web.Request) -> web.Response:
        methods = self.routes[request.match_info.route.resource.canonical.rstrip("/")]
        handler = methods.get(request.method)
        if handler is None:
            if request.method == "HEAD" and "GET" in methods:
                handler = methods["GET"]
            else:
                return error_response(405, f"{request.method} is not allowed on {request.path}",
                                      Allow=", ".join(sorted(methods)))
        if request.method in MUTATING and not self.config.http_server_mutations_enabled:
            return error_response(403, f"{request.method} {request.path} changes the cluster: set"
                                       " http_server_mutations_enabled = true on this bookie to allow it")
        return await handler(self, request)
