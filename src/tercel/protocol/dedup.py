"""Dedup keys on the line protocols (docs/protocol.md §16): the ``key=<K>`` word of a keyed put
and memcache's replies to one. Sans-IO, as the codecs that call it (:mod:`.memcache`,
:mod:`.kestrel_text`): bytes in, commands or reply bytes out.
"""

from __future__ import annotations

from typing import Final

from tercel.errors import ProtocolError
from tercel.protocol.commands import KeyedSet

KEY_WORD: Final = b"key="
"""How a keyed put's key word starts (memcache ``set``, the text protocol's ``put``)."""
SET_USAGE: Final = "usage: set <queue> <flags> <exptime> <bytes> key=<key> [noreply]"


def key_word(token: bytes) -> str:
    """The key of a ``key=<K>`` word, as sent: the queues check it against the rule
    (:func:`tercel.names.key_problem`, once per put: ``QueueCollection.add_keyed``) and
    refuse it with ``BadKey`` naming the rule, after its payload was read."""
    return token[len(KEY_WORD) :].decode("latin-1")


def keyed_set(name: str, flags: int, exptime: int, tokens: list[bytes]) -> KeyedSet:
    """The keyed set of a memcache ``set`` line whose sixth word is ``key=<K>`` (``noreply``
    may follow); its payload is filled in when it arrives. Raises ProtocolError for a word
    after it other than ``noreply``."""
    key = key_word(tokens[5])
    if len(tokens) > 7 or (len(tokens) == 7 and tokens[6] != b"noreply"):
        raise ProtocolError(SET_USAGE)
    return KeyedSet(name, flags, exptime, b"", key, len(tokens) == 7)


def stored_id(item_id: int, duplicate: bool) -> bytes:
    """A keyed set's reply: ``STORED <item_id>``, or ``STORED <item_id> duplicate`` when an
    earlier put with the key, within the queue's window, stored the item."""
    if duplicate:
        return b"STORED %d duplicate\r\n" % item_id
    return b"STORED %d\r\n" % item_id
