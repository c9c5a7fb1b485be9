"""The beanstalkd front end: :mod:`.service` (shared state, timer, stats, listeners) and
:mod:`.connection` (one client's pump and handlers). The protocol is
:mod:`tercel.protocol.beanstalk`; the semantics live in :mod:`tercel.core.tubes`."""
