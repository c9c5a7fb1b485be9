"""beanstalkd's job model: tubes, priorities, delays, TTR reservations, bury and kick.

Contract. :class:`JobStore` holds every job in memory (as beanstalkd does) and applies the
semantics of beanstalkd 1.12, independent of any wire format:

- Job ids are global, start at 1, are never reused and continue after a restart (replay
  raises the counter past every id it saw).
- A worker (:class:`Worker`, one per connection) reserves the ready job with the smallest
  ``(priority, id)`` across its watched, non-paused tubes. Ties go by id, so a released old
  job goes back to its original place, before newer jobs of the same priority.
- Delayed jobs carry an absolute deadline; buried jobs form a FIFO per tube; ``kick`` kicks
  buried jobs if there are any, else delayed ones; ``kick_job`` either. ``pause`` with delay
  0 unpauses the tube at once.
- A reserved job is a reservation of the server's one
  :class:`~tercel.core.reservations.ReservationTable` (the store is its
  :class:`~tercel.core.source.ReservationSource`), owned by the worker, with the TTR as its
  deadline; when the deadline passes the table returns it and the job is ready again
  (``timeouts``). ``reserve`` answers DEADLINE_SOON when the worker holds a job within
  :data:`SAFETY_MARGIN_MS` of its deadline and nothing is ready; a worker already waiting is
  woken with it. ``touch`` extends the reservation.
- Waiting workers are served oldest first. :meth:`JobStore.disconnect` returns every job the
  worker holds to ready at once (the table's ``release_owner``: no timeout counted) and drops
  its wait. A job that becomes ready in the same timer pass as a wait's timeout goes to the
  waiter (beanstalkd's order: :mod:`.timers`).
- A tube lives while a job, a user, a watcher or a waiter refers to it; ``default`` always.

Time: one :class:`~tercel.clock.Clock`, the server's. Timers run on its monotonic
milliseconds, which are the reservation table's (the store refuses a table on another clock),
so a TTR deadline written here is the one the table enforces; the deadlines given to the log
are wall-clock epoch milliseconds, converted on the way in and out, so a delayed job keeps its
deadline across a restart. Nothing here sleeps: the server asks :meth:`JobStore.next_deadline`
(delays, waits, pauses), arms one timer, and calls :meth:`JobStore.tick` when it fires; TTR
deadlines are on the table's own timer (``tick`` returns those due too).

Durability: every change that must survive a restart is handed to the :class:`JobLog` before
the method returns (put, delete, bury, kick, a release with a delay or a new priority; the
promotion of a delayed job is not logged: replay uses its absolute deadline). Reservations
and touches are not logged: after a restart a reserved job is ready again.

Modules: :mod:`.model` (the data), :mod:`.log` (the log port), :mod:`.state` (the moves
between states, logging and replay), :mod:`.timers` (the timer pass), :mod:`.store` (the
commands). Import the names from here.
"""

from tercel.core.tubes.log import JobLog, NativeJobLog, ProtocolLog
from tercel.core.tubes.model import (
    BURIED,
    DEFAULT_TUBE,
    DELAYED,
    READY,
    RESERVED,
    STATE_NAMES,
    URGENT,
    WAKE_DEADLINE_SOON,
    WAKE_JOB,
    WAKE_TIMED_OUT,
    Counters,
    Job,
    JobRecord,
    StoreStats,
    Tube,
    Worker,
    ready_key,
)
from tercel.core.tubes.state import COMPACT_EVERY, COMPACT_RATIO, JOB_OVERHEAD, SAFETY_MARGIN_MS
from tercel.core.tubes.store import JobStore

__all__ = [
    "BURIED",
    "COMPACT_EVERY",
    "COMPACT_RATIO",
    "DEFAULT_TUBE",
    "DELAYED",
    "JOB_OVERHEAD",
    "READY",
    "RESERVED",
    "SAFETY_MARGIN_MS",
    "STATE_NAMES",
    "URGENT",
    "WAKE_DEADLINE_SOON",
    "WAKE_JOB",
    "WAKE_TIMED_OUT",
    "Counters",
    "Job",
    "JobLog",
    "JobRecord",
    "JobStore",
    "NativeJobLog",
    "ProtocolLog",
    "StoreStats",
    "Tube",
    "Worker",
    "ready_key",
]
