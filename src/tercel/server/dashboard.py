"""The web dashboard on the admin port: a page, the JSON it polls, and the actions it posts.

=============================== ====== ===================================================
path                            method answer
=============================== ====== ===================================================
``/``                           GET    the page (``static/index.html``)
``/static/<file>``              GET    its script, styles and uPlot (shipped in the package)
``/dashboard.json``             GET    the server and its queues now; ``?search=`` keeps
                                       the queues whose name contains it, ``?limit=`` (1-
                                       5000, default 500) the first so many by name
``/history.json``               GET    the last 15 minutes, one sample a second: server-wide,
                                       or ``?queue=<name>``; no samples and ``"kept": false``
                                       for a queue without rings (new, gone, beyond 256)
``/queues/<name>/flush``        POST   drop every item that is not reserved
``/queues/<name>/delete``       POST   delete the queue and its journal files
=============================== ====== ===================================================

The page asks for a confirmation before every POST (``/status/<s>`` included); the admin
server's own checks apply to these paths as to its others. The samples come from
:class:`~tercel.server.history.History`, taken every second by a timer on the server's loop.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from tercel.errors import UnavailableError
from tercel.names import valid_name
from tercel.server import figures, kestrel_figures, stats
from tercel.server.figures import DASHBOARD
from tercel.server.history import History
from tercel.server.http import error_response, json_response

if TYPE_CHECKING:
    from asyncio import TimerHandle

    from tercel.core.queue import PersistentQueue
    from tercel.server.context import ServerContext

STATIC = Path(__file__).resolve().parent / "static"
"""The page's files: ``index.html``, ``dashboard.js``, ``dashboard.css`` and uPlot (MIT,
``uPlot.LICENSE``), package data of tercel."""
SAMPLE_EVERY_S = 1.0
DEFAULT_LIMIT = 500
MAX_LIMIT = 5000
MATCH_SLICE = 4096
"""Queues matched against ``?search=`` per loop pass."""
_QUEUE_SHOWN = figures.shown(kestrel_figures.QUEUE, DASHBOARD)


class Dashboard:
    """The dashboard of one server: its routes and its sampling timer."""

    def __init__(self, server: ServerContext) -> None:
        self.server = server
        self.history = History()
        self._timer: TimerHandle | None = None

    def routes(self) -> list[web.AbstractRouteDef]:
        return [
            web.get("/", self.page),
            web.static("/static", STATIC),
            web.get("/dashboard.json", self.now),
            web.get("/history.json", self.past),
            web.post("/queues/{queue}/flush", self.flush),
            web.post("/queues/{queue}/delete", self.delete),
        ]

    # ---- sampling -------------------------------------------------------------------------

    def start(self) -> None:
        """Take a sample now and every second after."""
        self.sample()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def sample(self) -> None:
        """Record the server's and every tracked queue's depth and added count (a queue gets
        rings, while there is room, in the order the queues were made), then re-arm. Only
        the tracked queues are read, not every queue."""
        srv = self.server
        coll = srv.collection
        history = self.history
        rows = []
        for name in history.tracked_names():
            q = coll.replayed(name)
            if q is not None:
                rows.append((name, len(q), q.total_items))
        if room := history.room + len(history.tracked_names()) - len(rows):
            for q in coll:
                if not history.tracked(q.name):
                    rows.append((q.name, len(q), q.total_items))
                    room -= 1
                    if not room:
                        break
        history.record(srv.clock.now_ms(), (coll.total_length, coll.stats.total_items), rows)
        self._timer = srv.loop.call_later(SAMPLE_EVERY_S, self.sample)

    # ---- GET ------------------------------------------------------------------------------

    async def page(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    async def server_doc(self) -> dict[str, Any]:
        """The server's figures for the page's cards (those shown on the dashboard,
        ``server/kestrel_figures.py``; summed over the queues in slices) and the rates of the last
        second."""
        readings = await stats.drive(stats.server_steps(self.server, DASHBOARD))
        doc = dict(figures.keyed(readings, DASHBOARD))
        rates = self.history.latest_rates().get(None, (0.0, 0.0))
        doc.update(in_per_s=rates[0], out_per_s=rates[1])
        doc["auth"] = (
            self.server.auth.stats()
        )  # the auth_* counters: none on a server without users
        return doc

    def queue_doc(
        self, q: PersistentQueue, now: int, rates: tuple[float, float] | None
    ) -> dict[str, Any]:
        """One queue's row."""
        reading = stats.queue_reading(self.server, _QUEUE_SHOWN, q.name, q, now)
        doc: dict[str, Any] = {"name": q.name}
        doc.update(figures.keyed(reading.readings, DASHBOARD))
        doc.update(
            in_per_s=None if rates is None else rates[0],
            out_per_s=None if rates is None else rates[1],
            history=self.history.tracked(q.name),
        )
        return doc

    async def now(self, request: web.Request) -> web.Response:
        """The server and the first ``limit`` queues (by name) matching ``search``: matched
        :data:`MATCH_SLICE` queues per loop pass, their rows read ``stats.SLICE`` per pass."""
        search = request.query.get("search", "").strip()
        try:
            limit = int(request.query.get("limit", DEFAULT_LIMIT))
        except ValueError:
            limit = 0
        if not 1 <= limit <= MAX_LIMIT:
            return error_response(400, f"limit must be 1-{MAX_LIMIT}")
        needle = search.lower()
        queues = list(self.server.collection)
        first: list[PersistentQueue] = []
        matched = 0
        for i in range(0, len(queues), MATCH_SLICE):
            if i:
                await asyncio.sleep(0)
            found = [q for q in queues[i : i + MATCH_SLICE] if needle in q.name.lower()]
            matched += len(found)
            first = heapq.nsmallest(limit, first + found, key=_name)
        rows = []
        coll = self.server.collection
        for i in range(0, len(first), stats.SLICE):
            await asyncio.sleep(0)
            now = self.server.clock.now_ms()
            rates = self.history.latest_rates()
            rows += [
                self.queue_doc(q, now, rates.get(q.name))
                for q in first[i : i + stats.SLICE]
                if coll.replayed(q.name) is q  # (not deleted meanwhile)
            ]
        return json_response(
            {
                "server": await self.server_doc(),
                "queues": rows,
                "matched": matched,
                "search": search,
            }
        )

    async def past(self, request: web.Request) -> web.Response:
        name = request.query.get("queue")
        series = self.history.series(name)
        if series is None:  # created since the last sample, deleted, or beyond MAX_QUEUES
            series = {"t": [], "items": [], "in": [], "out": []}
        return json_response({**series, "kept": self.history.tracked(name) if name else True})

    # ---- POST -----------------------------------------------------------------------------

    async def flush(self, request: web.Request) -> web.Response:
        return await self._act(request, "flush")

    async def delete(self, request: web.Request) -> web.Response:
        return await self._act(request, "delete")

    async def _act(self, request: web.Request, verb: str) -> web.Response:
        """Flush or delete a queue; one not replayed yet is waited for (the background
        replay does it next), as a command on it would be, so the loop goes on serving."""
        name = request.match_info["queue"]
        if not valid_name(name):
            return error_response(400, f"bad queue name {name[:200]!r}")
        coll = self.server.collection
        while (pending := coll.pending_reached(name)) is not None:
            ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            coll.wait_for(pending, functools.partial(_settle, ready))
            await ready
        try:
            self.server.check_writable()
        except UnavailableError as exc:
            return error_response(409, str(exc))
        if coll.queue(name) is None:
            return error_response(404, f"no queue {name!r}")
        if verb == "flush":
            coll.flush(name)
        else:
            coll.delete(name)
        return json_response({"response": "ok", "queue": name, verb: True})


def _settle(ready: asyncio.Future[None]) -> None:
    if not ready.done():  # (not if the request was cancelled meanwhile)
        ready.set_result(None)


def _name(q: PersistentQueue) -> str:
    return q.name
