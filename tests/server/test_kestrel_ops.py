"""Kestrel's operation layer (server/kestrel/ops.py): the error kinds every Kestrel front end
words its own way, and the operation rows the pump runs."""

from __future__ import annotations

from typing import Any

import pytest

from tercel.errors import (
    BadQueueName,
    ConfigError,
    JournalOutOfDescriptors,
    JournalWriteError,
    NoSpaceLeft,
    OpenReadError,
    ProtocolError,
    QueueError,
    TercelError,
    TooManyLeases,
    UnavailableError,
)
from tercel.server.connection import Operation
from tercel.server.context import WRITES
from tercel.server.kestrel import ops


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (ProtocolError("bad"), ops.BAD_REQUEST),
        (QueueError("no"), ops.BAD_REQUEST),
        (BadQueueName("a/b"), ops.BAD_REQUEST),
        (OpenReadError("too many open reads"), ops.OPEN_READS),
        (UnavailableError("server is shutting down"), ops.UNAVAILABLE),
        (TooManyLeases(), ops.UNAVAILABLE),
        (NoSpaceLeft(), ops.NO_SPACE),
        (JournalWriteError("disk full", "/d/q", 0), ops.JOURNAL),
        (ConfigError("bad file"), ops.CONFIG),
        (TercelError("else"), ops.OTHER),
    ],
)
def test_error_kinds(exc: TercelError, kind: int) -> None:
    assert ops.error_kind(exc) == kind


def test_out_of_descriptors_is_unavailable_before_it_is_a_journal_error() -> None:
    """Both an UnavailableError and a JournalError: every front end answered it as the first."""
    exc = JournalOutOfDescriptors("/d/q", 0)
    assert ops.error_kind(exc) == ops.UNAVAILABLE


def test_error_reason_is_the_reason_or_the_text() -> None:
    assert ops.error_reason(QueueError("Not that many transactions open.")) == (
        "Not that many transactions open."
    )
    assert ops.error_reason(TercelError("plain")) == "plain"


def test_an_operation_row_names_its_counter() -> None:
    def handler(conn: Any, cmd: Any) -> None:
        pass

    op = Operation("flush_queue", handler, WRITES)
    assert (op.name, op.counter, op.access, op.handler) == (
        "flush_queue",
        "cmd_flush_queue",
        WRITES,
        handler,
    )
