"""`hetswarm monitor --web HOST:PORT`: the monitor as one live page and a JSON API, served with aiohttp.

The page (static/index.html, monitor.js, monitor.css, shipped as package data: no build step, nothing fetched from
elsewhere at run time) polls `/api/v1/state`. That is the snapshot `monitor --json` prints, read with the same
SwarmSnapshot reader, plus a history of Progress kept here: the DHT holds only each peer's latest step, so the loss
and step-time curves need a reader that remembers. A read that times out keeps the last state and says so.
"""
from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from hivemind.utils import get_dht_time

from hetswarm.client.monitor.snapshot import SwarmSnapshot
from hetswarm.protocol.errors import HetswarmError, RejectedInput
from hetswarm.protocol.record_store import SwarmRecords
from hetswarm.protocol.records import Assignment, PeerId, Progress
from hetswarm.protocol.remembered_peers import RememberedPeers

__all__ = ["ProgressHistory", "WebAddress", "WebMonitor", "serve_web"]

logger = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).with_name("static")
API_PATH = "/api/v1/state"
SECURITY_HEADERS = {
    # The page loads only what this server ships; a browser refuses anything else (and any inline script).
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class WebAddress:
    """Where the page is served: `--web HOST:PORT` (an IPv6 host in brackets; port 0 picks a free one)."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> WebAddress:
        host, sep, port = text.strip().rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if not sep or not host or not port.isdigit() or int(port) > 65535 or any(c.isspace() or c in "/[]" for c in host):
            raise RejectedInput(f"--web must be HOST:PORT, e.g. 127.0.0.1:8080 (port 0 picks a free one), got {text!r}")
        return cls(host=host, port=int(port))

    def url(self, bound: tuple[str, int]) -> str:
        """The URL to print for the socket bound; a wildcard host is shown as the loopback address (served too),
        and a host name with port 0 as the address bound (each address of a name gets its own free port)."""
        host, port = bound[0], bound[1]
        if _ip_version(self.host) is not None or self.port != 0:
            host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        return f"http://[{host}]:{port}/" if _ip_version(host) == 6 else f"http://{host}:{port}/"


def _ip_version(host: str) -> int | None:
    try:
        return ipaddress.ip_address(host).version
    except ValueError:
        return None


class ProgressHistory:
    """Per peer, (assignment version, step) → loss and step time, bounded, for the page's curves.

    Args:
        max_points_per_peer: the oldest steps of a peer are dropped past this many.
        max_peers: the peer heard from least recently is dropped past this many (peers come and go).
        max_versions: predictions kept for this many assignment versions, the newest.
    """

    def __init__(self, *, max_points_per_peer: int = 2000, max_peers: int = 256, max_versions: int = 64) -> None:
        if min(max_points_per_peer, max_peers, max_versions) < 1:
            raise ValueError("every ProgressHistory bound must be at least 1")
        self.max_points_per_peer, self.max_peers, self.max_versions = max_points_per_peer, max_peers, max_versions
        self._points: OrderedDict[PeerId, OrderedDict[tuple[int, int], dict[str, Any]]] = OrderedDict()
        self._held_out: dict[PeerId, OrderedDict[int, float]] = {}
        """Each peer's held-out losses by the step they were measured after (Progress keeps only the newest)."""
        self._predicted_step_s: OrderedDict[int, float] = OrderedDict()

    def record(self, progress: Iterable[Progress]) -> None:
        """Adds each peer's latest step; a step seen before is overwritten, not duplicated."""
        for p in progress:
            points = self._points.setdefault(p.peer_id, OrderedDict())
            self._points.move_to_end(p.peer_id)
            points[(p.assignment_version, p.step)] = {
                "version": p.assignment_version, "step": p.step, "loss": p.loss, "compute_s": p.compute_s,
                "wait_s": p.wait_s, "step_s": p.compute_s + p.wait_s, "tokens_per_s": p.tokens_per_s,
            }
            while len(points) > self.max_points_per_peer:
                points.popitem(last=False)
            if p.held_out_loss is not None and p.held_out_step is not None:
                held_out = self._held_out.setdefault(p.peer_id, OrderedDict())
                held_out[p.held_out_step] = p.held_out_loss
                while len(held_out) > self.max_points_per_peer:
                    held_out.popitem(last=False)
        while len(self._points) > self.max_peers:
            self._held_out.pop(self._points.popitem(last=False)[0], None)

    def note_assignment(self, assignment: Assignment | None) -> None:
        """Remembers the step time the plan of each version predicted, to draw beside what was measured."""
        if assignment is None:
            return
        self._predicted_step_s[assignment.version] = assignment.predicted_step_s
        self._predicted_step_s.move_to_end(assignment.version)
        while len(self._predicted_step_s) > self.max_versions:
            self._predicted_step_s.popitem(last=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "peers": {peer: [points[key] for key in sorted(points)] for peer, points in self._points.items()},
            "predictions": [{"version": v, "predicted_step_s": s} for v, s in sorted(self._predicted_step_s.items())],
            "held_out": {peer: sorted(losses.items()) for peer, losses in self._held_out.items()},
            "max_points_per_peer": self.max_points_per_peer,
        }


class WebMonitor:
    """Reads the swarm every `refresh_s` and answers the page with the last state it read."""

    def __init__(self, records: SwarmRecords, *, coordinator: PeerId | None, refresh_s: float,
                 history: ProgressHistory | None = None) -> None:
        if refresh_s <= 0:
            raise RejectedInput(f"--refresh must be positive, got {refresh_s}")
        self.records, self.coordinator, self.refresh_s = records, coordinator, refresh_s
        self.history = history or ProgressHistory()
        empty = SwarmSnapshot(swarm=records.swarm, peers={}, assignments={}, progress={}, read_at=get_dht_time())
        self.snapshot: dict[str, Any] = empty.to_json(coordinator)
        self.read_at: float | None = None
        """Wall-clock time of the last read that succeeded; None before the first."""
        self.error: str | None = None
        self.reads = self.failed_reads = 0
        self.remembered = RememberedPeers()

    async def refresh(self) -> None:
        """One read of the swarm; on a timeout or a failed read the last state stays, with the reason beside it."""
        try:
            snapshot = await SwarmSnapshot.read(self.records, self.coordinator,  # each under SwarmRecords' deadline
                                                remembered=self.remembered)
            state = snapshot.to_json(self.coordinator)
        except TimeoutError:
            self.failed_reads += 1
            self.error = f"the swarm's records could not be read within {self.records.timeout_s:g} s"
            logger.warning(f"Web monitor: {self.error}; showing the last state")
            return
        except Exception as e:  # a DHT that failed under us: say so on the page, keep serving the last state
            self.failed_reads += 1
            self.error = f"reading the swarm failed: {type(e).__name__}: {e}"
            logger.warning(f"Web monitor: {self.error}", exc_info=logger.isEnabledFor(logging.DEBUG))
            return
        self.history.record(snapshot.progress.values())
        self.history.note_assignment(snapshot.assignment(self.coordinator))
        self.snapshot, self.read_at, self.error = state, time.time(), None
        self.reads += 1

    async def run(self, stop: asyncio.Event) -> None:
        """Refreshes until `stop` is set (Ctrl+C)."""
        await self.refresh()
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.refresh_s)
            except TimeoutError:
                await self.refresh()

    def state(self) -> dict[str, Any]:
        """What /api/v1/state answers: the snapshot, the history, and how fresh they are."""
        age_s = None if self.read_at is None else max(0.0, time.time() - self.read_at)
        return _finite({
            **self.snapshot,
            "history": self.history.to_json(),
            "monitor": {"refresh_s": self.refresh_s, "read_at": self.read_at, "age_s": age_s, "error": self.error,
                        "reads": self.reads, "failed_reads": self.failed_reads, "coordinator": self.coordinator},
        })

    def application(self) -> web.Application:
        app = web.Application(middlewares=[_headers], client_max_size=1024)  # the page sends no bodies
        app.router.add_get("/", self._index)
        app.router.add_get(API_PATH, self._state)
        app.router.add_static("/static/", STATIC_DIR, follow_symlinks=False)
        return app

    async def _index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC_DIR / "index.html")

    async def _state(self, request: web.Request) -> web.Response:
        return web.json_response(self.state(), dumps=lambda data: json.dumps(data, allow_nan=False),
                                 headers={"Cache-Control": "no-store"})


@web.middleware
async def _headers(request: web.Request, handler: Callable) -> web.StreamResponse:
    """Security headers on every answer, errors too; aiohttp itself answers a bad request with 4xx and serves on."""
    try:
        response = await handler(request)
    except web.HTTPException as e:
        e.headers.update(SECURITY_HEADERS)
        raise
    response.headers.update(SECURITY_HEADERS)
    return response


def _finite(value: Any) -> Any:
    """The same data with NaN and infinities as null: JSON has no such numbers and a browser refuses them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


async def serve_web(records: SwarmRecords, address: WebAddress, *, stop: asyncio.Event, coordinator: PeerId | None,
                    refresh_s: float, on_ready: Callable[[str], None]) -> None:
    """Serves the page until `stop` is set; `on_ready` gets the `Web view: URL` line once the port is bound."""
    monitor = WebMonitor(records, coordinator=coordinator, refresh_s=refresh_s)
    runner = web.AppRunner(monitor.application(), access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    try:
        try:
            await web.TCPSite(runner, address.host, address.port).start()
        except OSError as e:  # taken port, unknown host, no permission
            raise HetswarmError(f"cannot serve the web view on {address.host}:{address.port}: "
                                f"{e.strerror or e}") from None
        bound = runner.addresses[0]
        on_ready(f"Web view: {address.url(bound)}")
        logger.info(f"Serving the web view of swarm {records.swarm!r} on {bound[0]}:{bound[1]}")
        await monitor.run(stop)
    finally:
        await runner.cleanup()
