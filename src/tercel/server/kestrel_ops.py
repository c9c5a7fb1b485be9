"""Operations the text and Thrift front ends share (Kestrel's handlers had them in
``KestrelHandler``): adding a batch of items, and setting the status from a client's word.

Protocol-neutral: the callers turn the results and the errors into their own replies.
"""

from __future__ import annotations

from collections.abc import Sequence

from tercel.errors import ItemTooLarge, UnavailableError
from tercel.server.context import ServerContext
from tercel.server.status import Status


def put_items(
    ctx: ServerContext, queue: str, items: Sequence[bytes], expiry_ms: int, stop_at_refusal: bool
) -> int:
    """Add ``items`` to ``queue`` in order, each expiring ``expiry_ms`` from now (0 or less:
    never); the number added. An item refused (queue full, larger than ``max_item_size``) is
    not counted; with ``stop_at_refusal`` the items after it are not tried (Thrift's ``put``),
    without it they are (the text ``put``). The reply must go through the connection's pump,
    which holds it until every record is journaled. No log maintenance runs inside the batch
    (a rotation would write the items added so far): each queue's journal gets the batch in
    the pass's one write, so a write failure keeps none of it (docs/protocol.md).

    The caller checks the status first (``ctx.check(WRITES)``). Raises BadQueueName or a
    journal error.
    """
    coll = ctx.collection
    now = ctx.now
    expiry = now + expiry_ms if expiry_ms > 0 else None
    coll.stats.cmd_set += len(items)
    n = 0
    for data in items:
        try:
            stored = coll.add(queue, data, expiry, now, maintain=False)
        except ItemTooLarge:
            stored = False
        if stored:
            n += 1
        elif stop_at_refusal:
            break
    return n


def set_status(ctx: ServerContext, status: Status) -> None:
    """Persist and apply ``status``; UnavailableError when the status file cannot be written."""
    try:
        ctx.set_status(status)
    except OSError as exc:
        raise UnavailableError(f"cannot write the status file: {exc.strerror or exc}") from None
