"""GET /metrics on its own small aiohttp server, for a process without the bookie's HTTP admin
server (`bk autorecovery` with autorecovery_metrics_port). Metrics are exported only from
bk.server (ARCHITECTURE.md: every layer may record, only server/ exports), and aiohttp lives
here too.
"""
from __future__ import annotations

import logging

from bk.config import BookieConfig

log = logging.getLogger("bk.autorecovery")


class MetricsServer:
    """GET /metrics only (bk.metrics' page), for a process without the bookie's HTTP server."""

    def __init__(self, cfg: BookieConfig):
        self.cfg = cfg
        self.address = cfg.http_server_address or "127.0.0.1"
        self.port: int | None = None
        self._runner = None

    async def start(self) -> "MetricsServer":
        from aiohttp import web

        from bk import metrics
        from bk.errors import BKError

        async def page(request):
            body, content_type = metrics.exposition()
            resp = web.Response(body=body)
            resp.headers["Content-Type"] = content_type
            return resp

        app = web.Application()
        app.router.add_get("/metrics", page)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.address, self.cfg.autorecovery_metrics_port, reuse_address=True)
        try:
            await site.start()
        except OSError as e:
            await self._runner.cleanup()
            self._runner = None
            raise BKError(f"autorecovery metrics cannot listen on {self.address}:{self.cfg.autorecovery_metrics_port}"
                          f" ({e.strerror or e}); set autorecovery_metrics_port (0 = any free port, -1 = off)") from None
        self.port = site._server.sockets[0].getsockname()[1]
        log.info("autorecovery metrics on %s", self.url)
        return self

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}/metrics"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
