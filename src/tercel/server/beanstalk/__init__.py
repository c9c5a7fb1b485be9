"""The beanstalkd front end: :mod:`.frontend` (its start hook: the service of one server and its
connections' factory), :mod:`.connection` (one client's pump and handlers) and :mod:`.service`
(shared state: job store, job log, timer, stats), each importing only those listed after it
(an import-linter contract). The protocol is :mod:`tercel.protocol.beanstalk`; the semantics
live in :mod:`tercel.core.tubes`."""
