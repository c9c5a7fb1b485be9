"""The listening TCP socket both command lines make before the server's modules load.

Imports only ``socket``: ``tercel serve`` and ``tercel beanstalkd`` bind their ports first, so
the kernel accepts connections into the backlog about 50-70 ms after ``exec`` (client test
suites connect 100 ms after starting the binary), and the commands are served once the server
is up (socket activation does the same).
"""

from __future__ import annotations

import socket


def bind_tcp(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port`` (the first address ``getaddrinfo`` gives;
    port 0 picks a free one), with ``SO_REUSEADDR`` and a backlog of 1024. Raises OSError."""
    # An ASCII host as bytes: a str is IDNA-encoded first (~8 ms of codec imports).
    name: str | bytes = host.encode() if host.isascii() else host
    family, kind, proto, _, addr = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock
