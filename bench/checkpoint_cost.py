"""What one checkpoint costs the event loop (issue 24), in-process.

A checkpoint (docs/journal_format.md §16) is written on the loop, once per 16 MB appended,
inside the queue's log maintenance: a pass over the items in memory (each must follow the one
before, never delivered), the records written out, an ``fdatasync`` when the journal's owner
syncs it (``sync_journal`` true or a period), the walk from the last mark to the head's ADD
record, a crc32 over the last 4 KiB, and a small file written and renamed.

This script fills a queue over its real file journal (write-through, as the tools use it; in
the server the group commit writes the same bytes) with ``--items`` items of ``--size``
bytes, then times ``--rounds`` checkpoints, each after another 16 MB appended, first as an
unsynced journal, then after a sync (each checkpoint then pays an ``fdatasync`` of what the
16 MB left unsynced). Prints one JSON line per mode: min, median and max milliseconds.

Usage: ``.venv/bin/python bench/checkpoint_cost.py [--items 131072] [--size 1024]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from tercel.clock import SystemClock
from tercel.config import ServerConfig
from tercel.journal.journal import CHECKPOINT_EVERY, FileJournal
from tercel.storage import open_queue


def run(items: int, size: int, rounds: int, synced: bool, data_dir: str) -> dict[str, object]:
    cfg = ServerConfig().queue_config("q")
    q = open_queue(data_dir, "q", cfg, SystemClock())
    q.replay()
    log = q.log
    assert isinstance(log, FileJournal)
    payload = b"x" * size
    for _ in range(items):
        q.add(payload)
    per_round = max(1, CHECKPOINT_EVERY // size)
    times = []
    for _ in range(rounds):
        for _ in range(per_round):  # 16 MB more: past the window, on disk (read-behind)
            q.add(payload)
        if synced:
            log.sync()
            for _ in range(per_round):  # what the next sync would have to write out
                q.add(payload)
        t0 = time.perf_counter()
        ok = q.checkpoint()
        times.append(time.perf_counter() - t0)
        assert ok, "no checkpoint written"
    q.close()
    ms = sorted(t * 1000 for t in times)
    return {
        "mode": "synced" if synced else "unsynced",
        "items_in_memory": len(q._items),
        "size": size,
        "rounds": rounds,
        "min_ms": round(ms[0], 2),
        "median_ms": round(statistics.median(ms), 2),
        "max_ms": round(ms[-1], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=131072, help="items before the first round")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    for synced in (False, True):
        with tempfile.TemporaryDirectory(prefix="tercel-ckpt-", dir=".") as d:
            print(json.dumps(run(a.items, a.size, a.rounds, synced, d)), flush=True)


if __name__ == "__main__":
    main()
