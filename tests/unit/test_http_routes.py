"""The HTTP admin server serves the one explicit list of routes it is handed
(bk.server.http_routes.ROUTES for a bookie): no handler registers itself on import, and
http_admin (server and shared helpers) imports no handler module."""
import ast
import inspect
import types
from pathlib import Path

import aiohttp
import pytest

from bk import eventloop

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names.add(node.module or "")
            names.update(f"{node.module or ''}.{a.name}".lstrip(".") for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_the_server_imports_no_handler_module():
    imported = imported_modules(ROOT / "bk/server/http_admin.py")
    for handlers in ("http_handlers", "http_ops", "http_routes"):
        assert not any(handlers in name for name in imported), (handlers, imported)


def test_every_handler_has_one_row_and_every_row_one_path_and_method():
    from bk.server import http_handlers, http_ops
    from bk.server.http_admin import route_table
    from bk.server.http_routes import ROUTES
    table = route_table(ROUTES)  # a path and method twice raises
    assert sum(len(r.methods) for r in ROUTES) == sum(len(m) for m in table.values())
    served = {r.handler for r in ROUTES}
    for module in (http_handlers, http_ops):
        handlers = {fn for name, fn in vars(module).items() if inspect.iscoroutinefunction(fn)
                    and fn.__module__ == module.__name__ and not name.startswith("_")
                    and list(inspect.signature(fn).parameters) == ["admin", "request"]}
        assert handlers and handlers <= served, sorted(f.__name__ for f in handlers - served)
    assert {"/heartbeat", "/metrics", "/api/v1/bookie/sanity", "/api/v1/ledger/read"} <= set(table)


def test_a_route_given_twice_is_an_error():
    from bk.server.http_admin import Route, route_table

    async def one(admin, request):
        pass
    with pytest.raises(ValueError, match="GET /x is given twice"):
        route_table([Route("/x", ("GET", "PUT"), one), Route("/x", ("GET",), one)])


def test_the_server_serves_exactly_the_routes_it_is_handed():
    from bk.server.http_admin import HttpAdminServer, Route, json_response

    async def hello(admin, request):
        return json_response({"hello": admin.server.name})
    config = types.SimpleNamespace(http_server_address="127.0.0.1", http_server_port=0, http_server_tls_enable=False,
                                   http_server_token="", http_server_mutations_enabled=False,
                                   advertised_address="127.0.0.1")

    async def main():
        http = await HttpAdminServer(types.SimpleNamespace(name="b1"), config, [Route("/hello", ("GET",), hello)]).start()
        try:
            async with aiohttp.ClientSession(http.url) as s:
                async with s.get("/hello") as r:
                    assert r.status == 200 and await r.json() == {"hello": "b1"}
                async with s.get("/hello/") as r:  # BookKeeper's trailing slash too
                    assert r.status == 200
                async with s.put("/hello") as r:
                    assert r.status == 405 and r.headers["Allow"] == "GET"
                async with s.get("/heartbeat") as r:  # not handed: not served
                    assert r.status == 404
        finally:
            await http.stop()
    eventloop.run(main())
