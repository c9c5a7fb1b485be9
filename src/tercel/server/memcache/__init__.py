"""The memcache front end (Kestrel's memcache protocol): the codec is
:mod:`tercel.protocol.memcache`; :mod:`.connection` holds the connection and the core
handlers, :mod:`.leases` the lease and monitor extensions."""
