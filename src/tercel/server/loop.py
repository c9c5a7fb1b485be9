"""The event loop every tercel server runs on: uvloop where it is installed."""

from __future__ import annotations

import asyncio


def new_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's (a dependency on Linux), else asyncio's default."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop
