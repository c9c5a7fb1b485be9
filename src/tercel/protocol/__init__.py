"""Sans-IO wire codecs: bytes in, commands out; replies in, bytes out.

Nothing here touches a socket, a file or an event loop; the server feeds bytes in and writes
the bytes that come out. Imports only :mod:`tercel.errors`, :mod:`tercel.names`, each other,
and thriftpy2 (:mod:`~tercel.protocol.thrift` decodes with it, after its own bounds check).

- :mod:`~tercel.protocol.memcache`: Kestrel's memcache protocol (server side);
  :mod:`~tercel.protocol.memcache_client` its client side.
- :mod:`~tercel.protocol.kestrel_text`: Kestrel's line-based text protocol.
- :mod:`~tercel.protocol.thrift_framing` and :mod:`~tercel.protocol.thrift`: Kestrel's Thrift
  service (framed transport, binary protocol; IDL in ``kestrel.thrift`` beside them).
"""
