"""JSON answers of the admin HTTP server (the admin endpoints and the dashboard share them)."""

from __future__ import annotations

import json

from aiohttp import web


def json_response(doc: object, status: int = 200) -> web.Response:
    """``doc`` as compact JSON (``application/json; charset=utf-8``), never cached."""
    return web.Response(
        text=json.dumps(doc, separators=(",", ":")),
        status=status,
        content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


def error_response(status: int, reason: str) -> web.Response:
    """``{"error": reason}`` with the HTTP ``status``."""
    return json_response({"error": reason}, status)
