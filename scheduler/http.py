"""The scheduler's read-only HTTP face: live dashboard, JSON API, Prometheus metrics, WebSocket updates.

GET only: nothing served here changes the scheduler, so it is safe to leave open to a team on a
trusted network (it binds 127.0.0.1 unless told otherwise). The page is plain HTML + SVG + vanilla
JavaScript under `scheduler/dashboard/`: no build step, no third-party script.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CONTENT_TYPE_LATEST

from overlay.burstlog import BurstLog

from .live import LiveState
from .service import Scheduler

log = logging.getLogger("wansync.http")
MAX_WS_CLIENTS = 32  # live pages at once: each costs a pusher task and a snapshot per connect
# The dashboard's refusals (malformed requests, unknown methods, too many live pages): one line per
# burst of each kind, like the scheduler's and the agents' (bounded: overlay.burstlog)
REFUSALS = BurstLog(log)


class _BadRequests(logging.Filter):
    """A malformed request (oversized header, garbage, an unknown method) gets its 400 and one log
    line per burst, not a traceback per request: it is the client's error, not ours."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            text = (exc.message or str(exc)).strip()  # declared on HttpProcessingError (a class default)
            first = text.splitlines()[0] if text else type(exc).__name__
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else None
            REFUSALS.log(logging.WARNING, "bad HTTP request",
                         f"dashboard refused a malformed HTTP request from {remote} with {exc.code or 400} "
                         f"({type(exc).__name__}: {first[:200]})", peer=remote if isinstance(remote, str) else None)
            return False
        return log.isEnabledFor(record.levelno)  # the rest as if this logger had the level of the others


# aiohttp reports an unknown method at DEBUG ("common on the internet"): it is a refusal like the others,
# so this logger lets DEBUG records reach the filter, which logs refusals per burst and passes on the rest
# only at the level "wansync.http" logs at
_server_log = logging.getLogger("wansync.http.server")
_server_log.setLevel(logging.DEBUG)
_server_log.addFilter(_BadRequests())

STATIC = Path(__file__).parent / "dashboard"
PUSH_EVERY_S = 0.5  # WebSocket update period: faster than the 1 s throughput points, cheap at 26 links


def parse_hostport(text: str) -> tuple[str, int]:
    """'HOST:PORT' (or ':PORT', or '[::1]:PORT') -> (host, port); port 0 picks a free one."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return (host.strip("[]") or "127.0.0.1"), int(port)


def _flight_key(flight: dict[str, Any]) -> tuple:
    """What distinguishes one picture of the tasks in flight from the next (ages aside)."""
    return (flight["job"],
            tuple((t["task"], t["attempt"], t["version"], tuple(t["reported"])) for t in flight["running"]),
            tuple((t["task"], t["attempt"], t["blocked"], tuple(t["at_barrier"])) for t in flight["waiting"]))


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=lambda d: json.dumps(d, default=str))


class DashboardServer:
    """aiohttp app over a LiveState; start() returns the URL to open."""

    def __init__(self, sched: Scheduler, live: LiveState | None = None, *, host: str = "127.0.0.1",
                 port: int = 0, push_every_s: float = PUSH_EVERY_S) -> None:
        self.sched = sched
        self.live = live or LiveState(sched)
        self.host = host
        self.port = port
        self.push_every_s = push_every_s
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._sockets: set[web.WebSocketResponse] = set()
        app = web.Application()
        app.add_routes([
            web.get("/", self.index),
            web.get("/api", self.api_index),
            web.get("/api/cluster", self.api_cluster),
            web.get("/api/view", self.api_view),
            web.get("/api/plan", self.api_plan),
            web.get("/api/rounds", self.api_rounds),
            web.get("/api/tasks", self.api_tasks),
            web.get("/api/series", self.api_series),
            web.get("/api/timeline", self.api_timeline),
            web.get("/metrics", self.metrics),
            web.get("/ws", self.websocket),
            web.static("/static", STATIC),
        ])
        app.on_shutdown.append(self._close_sockets)
        self.app = app

    async def start(self) -> str:
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False, logger=_server_log)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server  # aiohttp does not expose the bound port otherwise
        assert server is not None and server.sockets
        self.port = server.sockets[0].getsockname()[1]
        shown = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{shown}:{self.port}/"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _close_sockets(self, app: web.Application) -> None:
        for ws in list(self._sockets):
            await ws.close(code=1001, message=b"scheduler shutting down")

    # --- pages and JSON ---------------------------------------------------------------------------
    async def index(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html")

    async def api_index(self, request: web.Request) -> web.Response:
        return _json({"endpoints": ["/api/cluster", "/api/view", "/api/plan[?version=N]",
                                    "/api/rounds[?limit=N&scheme=S]", "/api/tasks[?limit=N&job=J]", "/api/series",
                                    "/api/timeline",
                                    "/metrics", "/ws"]})

    async def api_cluster(self, request: web.Request) -> web.Response:
        return _json(self.live.cluster())

    async def api_view(self, request: web.Request) -> web.Response:
        return _json(self.live.view())

    async def api_plan(self, request: web.Request) -> web.Response:
        version = request.query.get("version")
        if version is not None and not version.lstrip("-").isdigit():
            return _json({"error": "version must be an integer"}, 400)
        plan = self.live.plan(None if version is None else int(version))
        if plan is None:
            return _json({"error": "no such plan" if version else "no plan published yet"}, 404)
        return _json(plan)

    async def api_rounds(self, request: web.Request) -> web.Response:
        try:
            limit = int(request.query.get("limit", "100"))
        except ValueError:
            return _json({"error": "limit must be an integer"}, 400)
        return _json({"rounds": self.live.recent_rounds(limit, request.query.get("scheme"))})

    async def api_tasks(self, request: web.Request) -> web.Response:
        """Recent task records (every job's, a BSP round's included) and the current job's tasks in
        flight, with the plan trees they run."""
        try:
            limit = int(request.query.get("limit", "100"))
            job = request.query.get("job")
            job_id = None if job is None else int(job)
        except ValueError:
            return _json({"error": "limit and job must be integers"}, 400)
        return _json({"tasks": self.live.recent_tasks(limit, job_id), "in_flight": self.live.in_flight()})

    async def api_series(self, request: web.Request) -> web.Response:
        return _json({"step_s": self.live.step_s, "links": self.live.series_json()})

    async def api_timeline(self, request: web.Request) -> web.Response:
        return _json({"timeline": self.live.timeline()})

    async def metrics(self, request: web.Request) -> web.Response:
        resp = web.Response(body=self.live.metrics_text())
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    # --- live updates -----------------------------------------------------------------------------
    async def websocket(self, request: web.Request) -> web.WebSocketResponse:
        """A snapshot first, then every PUSH_EVERY_S what is new since this client's cursor."""
        if len(self._sockets) >= MAX_WS_CLIENTS:
            REFUSALS.log(logging.WARNING, "too many live pages",
                         f"dashboard refused a live page from {request.remote} with 503: already {MAX_WS_CLIENTS} "
                         f"open", peer=request.remote)
            return _json({"error": f"too many live clients (at most {MAX_WS_CLIENTS}); try again later"}, 503)
        ws = web.WebSocketResponse(heartbeat=20)
        await ws.prepare(request)
        self._sockets.add(ws)
        pusher = asyncio.create_task(self._push(ws))
        try:
            async for msg in ws:  # the page sends nothing that matters; reading notices the close
                if msg.type == WSMsgType.ERROR:
                    break
        finally:
            pusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pusher
            self._sockets.discard(ws)
        return ws

    async def _push(self, ws: web.WebSocketResponse) -> None:
        snap = self.live.snapshot()
        cursor, version = snap["seq"], snap["cluster"]["plan_version"]
        shown = _flight_key(snap["in_flight"])
        try:
            await ws.send_json({"type": "snapshot", **snap}, dumps=lambda d: json.dumps(d, default=str))
            while not ws.closed:
                await asyncio.sleep(self.push_every_s)
                items = self.live.since(cursor)
                if items:
                    cursor = items[-1]["seq"]
                msg: dict[str, Any] = {"type": "update", "seq": cursor, "items": items,
                                       "cluster": self.live.cluster(), "links": self.live.links()}
                if self.sched.version != version:
                    version = self.sched.version
                    msg["plan"] = self.live.plan()
                flight = self.live.in_flight()
                if _flight_key(flight) != shown:  # tasks started, ended, reported or blocked since the last push
                    shown = _flight_key(flight)
                    msg["in_flight"] = flight
                await ws.send_json(msg, dumps=lambda d: json.dumps(d, default=str))
        except (ConnectionError, RuntimeError) as exc:  # the page went away mid-send
            log.debug("dashboard client gone: %s", exc)
