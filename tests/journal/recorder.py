"""A RecordSink that writes down every call, and a file size limit (shared by the journal
tests)."""

from __future__ import annotations

import contextlib
import resource
import signal
from collections.abc import Iterator

Event = tuple[object, ...]


@contextlib.contextmanager
def file_size_limit(size: int) -> Iterator[None]:
    """No file of this process may grow past ``size`` bytes meanwhile: a write that would
    gets as far as the limit, then fails with EFBIG (as on a full disk)."""
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)


class Recorder:
    """A RecordSink that writes down every call."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def on_add(self, item_id: int, add_time: int, expiry: int, data: bytes) -> None:
        self.events.append(("add", item_id, add_time, expiry, data))

    def on_remove(self) -> None:
        self.events.append(("remove",))

    def on_open(self, xid: int) -> None:
        self.events.append(("open", xid))

    def on_confirm(self, xid: int) -> None:
        self.events.append(("confirm", xid))

    def on_abort(self, xid: int) -> None:
        self.events.append(("abort", xid))

    def on_return(self, xid: int) -> None:
        self.events.append(("return", xid))

    def on_flush(self) -> None:
        self.events.append(("flush",))

    def on_snapshot(self, next_id: int, xid: int) -> None:
        self.events.append(("snapshot", next_id, xid))

    def on_delivered(self, count: int) -> None:
        self.events.append(("delivered", count))

    def on_key_take(
        self,
        key: str,
        *,
        n: int,
        count: int,
        size: int,
        max_items: int,
        created_at: int,
        expires_at: int,
        from_head: bool,
    ) -> None:
        self.events.append(
            ("key_take", key, n, count, size, max_items, created_at, expires_at, from_head)
        )

    def on_key_end(self, key: str, how: int) -> None:
        self.events.append(("key_end", key, how))

    def on_key_renew(self, key: str, expires_at: int) -> None:
        self.events.append(("key_renew", key, expires_at))
