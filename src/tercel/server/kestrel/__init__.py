"""Kestrel's layer, shared by its three front ends (memcache, text, Thrift), as Kestrel's own
``KestrelHandler`` was under its three protocols: :mod:`.connection` is the connection base
that holds a client's session and waits for a queue's replay; :mod:`.ops` holds the
operations (put, flush, delete, status, confirm, monitor, leases, reservations by id) with
their stats counting and the classification of errors each front end words its own way."""
