"""Queue semantics: FIFO items, open reads, limits, expiry, waiters, fanout and aliases.

The core is synchronous and single-threaded: every method is called from one thread (the
server's event loop, or the embedding program) and returns without waiting. It never touches
sockets, wire formats or files; each queue writes through a :class:`~tercel.core.log.QueueLog`
it is given, and reads the time from an injected :class:`~tercel.clock.Clock`.
"""
