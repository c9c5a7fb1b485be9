"""Password hashes: scrypt from the standard library, in one self-describing string.

A stored password is ``scrypt$<n>$<r>$<p>$<salt>$<hash>`` (salt and hash in unpadded
URL-safe base64), made by :func:`hash_password` and checked by :func:`verify_password`:
``hashlib.scrypt`` with n = 2**15, r = 8, p = 1 (32 MiB and about 50 ms of one core per
check, the parameters RFC 7914 and OWASP's cheat sheet give for interactive logins), a
16-byte random salt and a 32-byte key. The parameters travel in the string, so stronger ones
may be used later without breaking the hashes already stored. The comparison is constant time
(``hmac.compare_digest``). No server imports: the CLI (``tercel passwd``) and the config
parser use it too.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from typing import Final

N: Final = 2**15
"""scrypt's cost (CPU and memory) of a new hash."""
R: Final = 8
P: Final = 1
SALT_BYTES: Final = 16
KEY_BYTES: Final = 32
MAX_N: Final = 2**20
"""The largest cost a stored hash may ask for (1 GiB with r = 8): a hash is refused beyond it,
so a config file cannot make each check take seconds."""
PREFIX: Final = "scrypt$"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _derive(password: bytes, salt: bytes, cost: tuple[int, int, int], size: int) -> bytes:
    n, r, p = cost
    return hashlib.scrypt(
        password, salt=salt, n=n, r=r, p=p, maxmem=129 * n * r + 2**20, dklen=size
    )


def hash_password(password: str | bytes, n: int = N) -> str:
    """A new ``scrypt$...`` string for ``password`` (a fresh random salt each call)."""
    secret = password.encode() if isinstance(password, str) else password
    salt = os.urandom(SALT_BYTES)
    key = _derive(secret, salt, (n, R, P), KEY_BYTES)
    return f"{PREFIX}{n}${R}${P}${_b64(salt)}${_b64(key)}"


def parse_hash(stored: str) -> tuple[int, int, int, bytes, bytes]:
    """``(n, r, p, salt, key)`` of a stored hash; ValueError naming what is wrong."""
    parts = stored.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise ValueError("expected scrypt$<n>$<r>$<p>$<salt>$<hash> (see `tercel passwd`)")
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt, key = _unb64(parts[4]), _unb64(parts[5])
    except ValueError:
        raise ValueError("malformed scrypt hash (see `tercel passwd`)") from None
    if n < 2 or n & (n - 1) or n > MAX_N or not 1 <= r <= 32 or not 1 <= p <= 16:
        raise ValueError(f"scrypt parameters out of range (n a power of 2 up to {MAX_N})")
    if len(salt) < 8 or not 16 <= len(key) <= 64:
        raise ValueError("scrypt salt or hash too short")
    return n, r, p, salt, key


def verify_password(password: bytes, stored: str) -> bool:
    """Whether ``password`` matches ``stored`` (slow on purpose: run it off the event loop).
    False for a malformed ``stored``."""
    try:
        n, r, p, salt, key = parse_hash(stored)
    except ValueError:
        return False
    return hmac.compare_digest(_derive(password, salt, (n, r, p), len(key)), key)
