"""The streaming source's offsets and lease keys (pure: no I/O, no pyspark).

An offset names one planned batch: ``{"v": 2, "id": "<uuid>", "seq": N, "leases":
{"<server>": <count>, ...}}``. ``id`` is drawn once per query by ``initialOffset`` and carried
by every later offset (Spark stores them in the checkpoint's offset log); ``seq`` is the batch
number (0: nothing planned yet); ``leases`` says how many items the keyed lease of batch N
holds on each server. The lease key of batch N is ``tercel.<id>.<N>`` on every server, so a
restarted driver plans the same keys and the servers hand out the same items again.

A source reading several queues (``queues``, ``queuePattern``) has one key per queue on a
server (a key belongs to one queue): ``tercel.<id>.<N>.<queue>``, and ``leases`` maps each
server to ``{"<queue>": <count>}``.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tercel.names import MAX_KEY_BYTES

VERSION = 2

OLD_CHECKPOINT = (
    "tercel source: this checkpoint was written by the staging connector (offsets {offset} "
    'have no "v": 2), which the keyed-lease source cannot continue: its staging directory '
    "may hold items already taken from the servers. Either drain it once with the release "
    "that wrote it (run the query with trigger(availableNow=True) until it stops), then start "
    "this version on a new checkpointLocation; or start on a new checkpointLocation now and "
    "delete the old staging directory (its staged, unprocessed items are then lost)"
)
"""The refusal of a start offset from the staging design (docs/spark.md §2)."""


class OldCheckpoint(ValueError):
    """A checkpoint of the staging design (offsets without ``"v": 2``)."""


Leases = dict[str, dict[str, int]]
"""Items per server and queue of one batch (only non-zero counts)."""


@dataclass(frozen=True, slots=True)
class Offset:
    """One source offset (see the module docstring)."""

    id: str
    seq: int
    leases: Leases = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Items in the batch, over every server and queue."""
        return sum(n for per_queue in self.leases.values() for n in per_queue.values())

    def to_json(self, single_queue: str | None) -> dict[str, Any]:
        """The offset as Spark stores it; keys sorted (Spark compares offsets as strings).
        ``single_queue``: the source reads this one queue, so each server has a plain count."""
        leases: dict[str, Any] = {}
        for server in sorted(self.leases):
            per_queue = self.leases[server]
            if single_queue is not None:
                leases[server] = per_queue.get(single_queue, 0)
            else:
                leases[server] = {q: per_queue[q] for q in sorted(per_queue)}
        return {"v": VERSION, "id": self.id, "seq": self.seq, "leases": leases}

    @classmethod
    def parse(cls, raw: Mapping[str, Any], single_queue: str | None) -> Offset:
        """An offset from Spark's JSON; :class:`OldCheckpoint` for the staging design's, a
        ValueError for anything else that is not an offset of this source."""
        if raw.get("v") != VERSION:
            raise OldCheckpoint(OLD_CHECKPOINT.format(offset=dict(raw)))
        try:
            ident, seq = str(raw["id"]), int(raw["seq"])
            leases: Leases = {}
            for server, got in dict(raw.get("leases") or {}).items():
                if isinstance(got, Mapping):
                    per_queue = {str(q): int(n) for q, n in got.items() if int(n) > 0}
                elif single_queue is not None:
                    per_queue = {single_queue: int(got)} if int(got) > 0 else {}
                else:
                    raise ValueError("a plain count needs a source on one queue")
                if per_queue:
                    leases[str(server)] = per_queue
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"tercel source: not an offset of this source: {raw} ({exc})"
            ) from None
        return cls(ident, seq, leases)

    @classmethod
    def initial(cls) -> Offset:
        """A new query's start: a fresh id, nothing planned."""
        return cls(uuid.uuid4().hex, 0, {})


def lease_key(ident: str, seq: int, queue: str | None) -> str:
    """The lease key of batch ``seq``: ``tercel.<id>.<seq>`` for a source on one queue, else
    ``tercel.<id>.<seq>.<queue>`` (``=`` and a digest of the queue name when that would pass
    the key length; ``=`` never appears in a queue name)."""
    key = f"tercel.{ident}.{seq}"
    if queue is None:
        return key
    full = f"{key}.{queue}"
    if len(full) <= MAX_KEY_BYTES:
        return full
    return f"{key}.={hashlib.sha1(queue.encode()).hexdigest()}"


def split(total: int, parts: int, turn: int) -> list[int]:
    """``total`` shared over ``parts`` as evenly as integers allow, the remainder going to the
    parts from index ``turn`` on (so no part is always the short one). Deterministic: a
    restarted driver asks every server for what it asked before."""
    if parts <= 0:
        return []
    base, extra = divmod(total, parts)
    return [base + (1 if (i - turn) % parts < extra else 0) for i in range(parts)]
