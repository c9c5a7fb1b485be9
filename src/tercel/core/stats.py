"""Server-wide counters as plain data; formatting lives with each protocol."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class GlobalStats:
    """Counters that outlive any one queue (Kestrel's global STATS lines)."""

    total_items: int = 0
    cmd_get: int = 0
    cmd_set: int = 0
    cmd_peek: int = 0
    get_hits: int = 0
    get_misses: int = 0
    queue_creates: int = 0
    queue_deletes: int = 0
    queue_expires: int = 0
    journal_torn_tails: int = 0
    """Torn journal tails cut off at start-up (see docs/journal_format.md)."""
