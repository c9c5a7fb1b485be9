"""Sans-IO wire codecs: bytes in, commands out; replies in, bytes out.

Nothing here touches a socket, a file or an event loop; the server feeds bytes in and writes
the bytes that come out. Imports only :mod:`tercel.errors` and :mod:`tercel.names`.
"""
