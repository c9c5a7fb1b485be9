"""``make soak``: producers and consumers under random kill -9, then every item accounted for.

One real server (``tercel serve`` on 127.0.0.1:0) with one queue per sync mode (``false``,
``true``, ``"50ms"``), all with tiny limits (``max_memory_size`` 4 KiB, ``max_journal_size``
16 KiB) so read-behind, rotation and compaction run all the time. Per queue, producers set
uniquely numbered items (``<queue>|<producer>|<n>|`` and padding), and three consumers take
them: plain ``get``, reliable reads (``get q/t=100/open`` then ``get q/close``) and leases
(``lease`` then one ``ack`` per lease id). Every few seconds (random) the server gets SIGKILL
and is started again on the same data directory; the clients reconnect to its new port.

At the end the producers stop, the server is killed once more and restarted, every queue is
drained with plain gets, and every item is accounted for:

- **acknowledged** items (``STORED`` received) must each be delivered: a plain ``get`` whose
  reply came, a reliable read whose ``close`` was answered, a lease whose ``ack`` said
  ``ACKED 1``, or the final drain. *Lost* counts those never seen at all; a plain ``get``
  interrupted by a kill may have taken one item with it (its removal is journaled before the
  reply), so ``unexplained_lost = lost - interrupted_plain_gets`` must be 0 (as must ``lost``
  when no plain get was interrupted). Removals do not carry the item id in the journal, so
  which item an interrupted get took cannot be named (docs/reliability.md).
- **duplicates** are items delivered more than once. An item whose read was never confirmed
  (the connection died with the read open or the lease unacked, an ack that did not say
  ``ACKED 1``) comes back: those are ``redelivered`` and allowed; a redelivered item that was
  never such an unconfirmed read is ``unexplained_redelivered`` and must be 0. An item
  *completed* twice (two plain gets, a confirmed read and a get, ...) is a
  ``duplicate_completed`` and must be 0. Items never sent (``phantom``) must be 0.
- **start-up failures**: a restart that exits or does not listen; must be 0. Tracebacks in the
  server log must be 0; ``tercel journal check`` on the final data directory must pass.

``--emfile`` runs the server under ``ulimit -n 128`` (soft and hard, so start-up cannot raise
it) with 150 more small queues (one ledger group, written and read in random order) and a
churning crowd of 160 idle connections: the server runs out of descriptors on accept (libuv
accepts and closes at once) and on journal opens (the pool evicts and reopens), again and
again; the accounting is the same, the pool's ``journal_files_*`` stats are summed over the
server's lives, and ``SERVER_ERROR`` (no descriptor left) counts as a refusal.

Exit 0 when all of that holds, 1 otherwise; the summary is printed as JSON (and written to
``--out``). Bounded: ``--seconds`` (default 120) of load, then the drain.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from serverlog import compiled_modules, tracebacks
from tercel.testing import ServerProcess, ServerStartError

QUEUES = {"soak_off": "false", "soak_on": "true", "soak_50ms": '"50ms"'}
BACKLOG = 5000
"""Producers pause while a queue holds about this many items (some 1 MB, 250x its memory)."""
CONFIG = """[queues]
max_memory_size = "4KB"
max_journal_size = "16KB"
max_journal_overflow = 4
"""


LOG_LINES = {
    "journals_failed_out_of_descriptors": "failed: Too many open files",
    "records_refused": "record refused: Too many open files",
    "rotations_put_off": "rotation put off",
    "compactions_put_off": "compaction put off",
    "queues_not_created": "not created: Too many open files",
    "returns_put_off": "not returned yet",
    "returns_left_until_restart": "not returned (they return at restart)",
}
"""Server log lines counted in the summary (``log_lines``). With ``--emfile`` the first must
be 0: a journal marked failed for want of a descriptor would refuse every later write to
its queue until a restart."""

MANY = "soak_many"
"""``--emfile``: the group of many small queues (``soak_many_000`` ...), written and read in
random order, so the journal descriptor pool evicts and reopens all the time."""
MANY_QUEUES = 150
OPEN_FILES = 128
"""``--emfile``: the server's ``ulimit -n`` (soft and hard): a pool of 32 journal files, and
fewer descriptors than the crowd of idle connections wants."""
CROWD = 160
"""``--emfile``: idle connections kept open (churned), more than the server has descriptors."""


def config_text() -> str:
    per = "".join(f"[queues.{q}]\nsync_journal = {mode}\n" for q, mode in QUEUES.items())
    return CONFIG + per


def queue_groups(emfile: bool) -> dict[str, list[str]]:
    """The ledgers' groups: one per sync mode (one queue each), and with ``--emfile`` the
    many small queues as one group (accounted together)."""
    groups = {q: [q] for q in QUEUES}
    if emfile:
        groups[MANY] = [f"{MANY}_{i:03d}" for i in range(MANY_QUEUES)]
    return groups


FAULTS_ENV = "TERCEL_SOAK_FAULTS"


def fault_scenario(rng: random.Random) -> tuple[str, list[dict[str, object]]]:
    """One server life's faults (``--faults``): a name and bench/faulty_serve.py's rules. The
    crashes land at the worst instants a kill -9 can only hit by chance: records written and
    their replies not yet sent, an fsync done, a compaction's rename."""
    crash_write = {"kind": "crash", "op": "pwritev", "skip": rng.randint(50, 4000)}
    choices: list[tuple[str, list[dict[str, object]]]] = [
        ("crash after a write", [{**crash_write, "after": True}]),
        ("crash before a write", [crash_write]),
        (
            "crash after an fsync",
            [{"kind": "crash", "op": "fdatasync", "after": True, "skip": rng.randint(5, 400)}],
        ),
        (
            "crash after a rename",
            [{"kind": "crash", "op": "rename", "after": True, "skip": rng.randint(0, 30)}],
        ),
        (
            "disk full",
            [
                {
                    "kind": "fail",
                    "op": "pwritev",
                    "errno": "ENOSPC",
                    "skip": rng.randint(50, 4000),
                    "times": rng.randint(1, 20),
                }
            ],
        ),
        (
            "EIO on fsync",
            [
                {
                    "kind": "fail",
                    "op": "fdatasync",
                    "errno": "EIO",
                    "skip": rng.randint(5, 400),
                    "times": 1,
                }
            ],
        ),
        ("slow disk", [{"kind": "slow", "op": "fdatasync", "seconds": 0.02}]),
        ("none", []),
    ]
    return rng.choice(choices)


class Dead(Exception):
    """The connection broke (the server was killed) or answered nonsense."""


class Refused(Exception):
    """The server answered ``SERVER_ERROR`` (an injected disk fault): nothing was done."""


class Conn:
    """A blocking memcache line connection that raises Dead on any failure."""

    def __init__(self, port: int) -> None:
        try:
            self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        except OSError as exc:
            raise Dead(str(exc)) from None
        self.buf = b""

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise Dead(str(exc)) from None

    def _more(self) -> None:
        try:
            chunk = self.sock.recv(65536)
        except OSError as exc:
            raise Dead(str(exc)) from None
        if not chunk:
            raise Dead("closed")
        self.buf += chunk

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._more()
        out, _, self.buf = self.buf.partition(b"\r\n")
        return out

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n + 2:
            self._more()
        out, self.buf = self.buf[:n], self.buf[n + 2 :]
        return out

    def value(self) -> bytes | None:
        """The payload of a get reply, None for END."""
        head = self.line()
        if head == b"END":
            return None
        parts = head.split()
        if head.startswith(b"SERVER_ERROR"):
            raise Refused(head.decode(errors="replace"))
        if parts[:1] != [b"VALUE"] or len(parts) < 4:
            raise Dead(f"unexpected {head!r}")
        data = self.exact(int(parts[3]))
        if self.line() != b"END":
            raise Dead("VALUE without END")
        return data

    def close(self) -> None:
        self.sock.close()


@dataclass
class Ledger:
    """What the clients saw (lists: appends are atomic under the GIL)."""

    sent: list[bytes] = field(default_factory=list)
    acked: list[bytes] = field(default_factory=list)
    received: list[bytes] = field(default_factory=list)
    """Every payload handed to a client, completed or not."""
    completed: list[tuple[bytes, str]] = field(default_factory=list)
    interrupted_plain_gets: int = 0
    refused: int = 0
    """Sets answered SERVER_ERROR under an injected disk fault."""
    unconfirmed: list[bytes] = field(default_factory=list)
    """Items handed out whose confirmation (close reply, ACKED 1) never came."""
    errors: list[str] = field(default_factory=list)


class Soak:
    def __init__(
        self,
        data_dir: Path,
        seconds: float,
        seed: int,
        *,
        plain: bool = True,
        faults: bool = False,
        emfile: bool = False,
    ) -> None:
        self.plain_gets = plain
        self.faults = faults
        self.emfile = emfile
        self.refusals_allowed = faults or emfile
        """``SERVER_ERROR`` is a refusal (nothing done), not a failure: an injected disk
        fault, or no descriptor left (``--emfile``)."""
        launcher = (sys.executable, str(Path(__file__).with_name("faulty_serve.py")))
        self.server = ServerProcess(
            data_dir,
            config_text(),
            log_level="info",
            launcher=launcher if faults else None,
            open_files=OPEN_FILES if emfile else None,
        )
        self.groups = queue_groups(emfile)
        self.crowd: Counter[str] = Counter()
        """``--emfile``: the idle connections' fates (opened, closed by the server, ...)."""
        self.server.env = {}
        self.scenarios: Counter[str] = Counter()
        self.scenario = "none"
        self.injected_crashes = 0
        self.refused_under_fault: list[str] = []
        self.unexpected_exits: list[int] = []
        self.seconds = seconds
        self.rng = random.Random(seed)
        self.port = 0
        self.stop = threading.Event()
        self.producing = threading.Event()
        self.consuming = threading.Event()
        self.ledgers = {g: Ledger() for g in self.groups}
        self.lock = threading.Lock()
        self.kills = 0
        self.start_failures: list[str] = []
        self.restart_s: list[float] = []
        self.journal_stats: Counter[str] = Counter()

    # ---- clients ------------------------------------------------------------------------

    def _connect(self) -> Conn | None:
        """A connection the server has answered once (``version``): one it accepted and
        closed at once (no descriptor, ``--emfile``) does not count a request as interrupted."""
        while not self.stop.is_set():
            conn = None
            try:
                conn = Conn(self.port)
                conn.send(b"version\r\n")
                if conn.line().startswith(b"VERSION"):
                    return conn
            except Dead:
                pass
            if conn is not None:
                conn.close()
            time.sleep(0.02)
        return None

    def _loop(
        self, body: Callable[[Conn], None], on_dead: Callable[[], None], gate: threading.Event
    ) -> None:
        def gated(conn: Conn) -> None:
            if not gate.is_set():
                self.stop.wait(0.05)
                return
            try:
                body(conn)
            except Refused:
                if not self.refusals_allowed:
                    raise Dead("SERVER_ERROR without an injected fault") from None
                self.stop.wait(0.02)  # the journal failed, or no descriptor: try again

        while not self.stop.is_set():
            conn = self._connect()
            if conn is None:
                return
            try:
                while not self.stop.is_set():
                    gated(conn)
            except Dead:
                on_dead()
            finally:
                conn.close()

    def _picker(self, group: str, salt: str) -> Callable[[], bytes]:
        """The queue of a group's next request (its only queue, or one of many at random)."""
        names = [n.encode() for n in self.groups[group]]
        if len(names) == 1:
            return lambda: names[0]
        rng = random.Random(f"{group}{salt}")
        return lambda: rng.choice(names)

    def producer(self, group: str, pid: int) -> None:
        ledger = self.ledgers[group]
        seq = iter(range(1 << 62))
        rng = random.Random(f"{group}{pid}")
        pick = self._picker(group, f"p{pid}")

        def body(conn: Conn) -> None:
            if len(ledger.acked) - len(ledger.completed) > BACKLOG:
                self.stop.wait(0.05)  # far into read-behind already: let the consumers catch up
                return
            queue = pick()
            item = b"%s|%d|%d|" % (queue, pid, next(seq))
            item += b"x" * rng.randrange(0, 400)
            ledger.sent.append(item)
            conn.send(b"set %s 0 0 %d\r\n%s\r\n" % (queue, len(item), item))
            reply = conn.line()
            if reply.startswith(b"SERVER_ERROR") and self.refusals_allowed:
                ledger.refused += 1  # a disk fault or no descriptor: not acknowledged
                self.stop.wait(0.02)
                return
            if reply != b"STORED":
                ledger.errors.append(f"set: {reply!r}")
                return
            ledger.acked.append(item)
            if rng.random() < 0.01:  # bursts and pauses, so the backlog grows and shrinks
                self.stop.wait(rng.uniform(0, 0.3))

        self._loop(body, lambda: None, self.producing)

    def plain(self, group: str) -> None:
        ledger = self.ledgers[group]
        inflight = [False]
        pick = self._picker(group, "plain")

        def body(conn: Conn) -> None:
            inflight[0] = True
            conn.send(b"get %s/t=100\r\n" % pick())
            data = conn.value()
            inflight[0] = False
            if data is not None:
                ledger.received.append(data)
                ledger.completed.append((data, "get"))

        def dead() -> None:
            if inflight[0]:
                with self.lock:
                    ledger.interrupted_plain_gets += 1
            inflight[0] = False

        self._loop(body, dead, self.consuming)

    def reliable(self, group: str) -> None:
        ledger = self.ledgers[group]
        holding: list[bytes] = []
        pick = self._picker(group, "reliable")

        def body(conn: Conn) -> None:
            queue = pick()
            conn.send(b"get %s/t=100/open\r\n" % queue)
            data = conn.value()
            if data is None:
                return
            holding.append(data)
            ledger.received.append(data)
            conn.send(b"get %s/close\r\n" % queue)
            try:
                if conn.value() is not None:
                    raise Dead("close returned an item")
            except Refused:
                ledger.unconfirmed.extend(holding)  # the read stays open; it comes back
                holding.clear()
                raise
            holding.clear()
            ledger.completed.append((data, "open/close"))

        def dead() -> None:
            ledger.unconfirmed.extend(holding)
            holding.clear()

        self._loop(body, dead, self.consuming)

    def leaser(self, group: str) -> None:
        ledger = self.ledgers[group]
        holding: list[bytes] = []
        pick = self._picker(group, "lease")

        def body(conn: Conn) -> None:
            queue = pick()
            conn.send(b"lease %s 4 100 30000\r\n" % queue)
            got: list[tuple[bytes, bytes]] = []
            while (head := conn.line()) != b"END":
                parts = head.split()
                if head.startswith(b"SERVER_ERROR") and not got:
                    raise Refused(head.decode(errors="replace"))
                if parts[:1] != [b"LEASED"] or len(parts) != 7:
                    raise Dead(f"unexpected {head!r}")
                got.append((parts[1], conn.exact(int(parts[6]))))
            for _, data in got:
                ledger.received.append(data)
                holding.append(data)
            for lease_id, data in got:
                conn.send(b"ack %s %s\r\n" % (queue, lease_id))
                reply = conn.line()
                holding.remove(data)
                if reply == b"ACKED 1":
                    ledger.completed.append((data, "lease"))
                else:
                    ledger.unconfirmed.append(data)

        def dead() -> None:
            ledger.unconfirmed.extend(holding)
            holding.clear()

        self._loop(body, dead, self.consuming)

    def idle_crowd(self) -> None:
        """``--emfile``: keep about CROWD idle connections open, more than the server has
        descriptors, closing a random few every tick so they churn: the server runs out of
        descriptors on accept and on journal opens, again and again."""
        rng = random.Random("crowd")
        socks: list[socket.socket] = []
        while not self.stop.is_set():
            while len(socks) < CROWD and not self.stop.is_set():
                try:
                    socks.append(socket.create_connection(("127.0.0.1", self.port), timeout=1))
                    self.crowd["opened"] += 1
                except OSError:
                    self.crowd["connect_failed"] += 1
                    break
            self.stop.wait(0.1)
            keep = []
            for sock in socks:
                if rng.random() < 0.05:
                    sock.close()
                    continue
                try:  # closed by the server (accepted and closed at once: no descriptor)?
                    sock.setblocking(False)
                    gone = sock.recv(1) == b""
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if gone:
                    self.crowd["closed_by_server"] += 1
                    sock.close()
                else:
                    keep.append(sock)
            socks = keep
        for sock in socks:
            sock.close()

    # ---- the server ---------------------------------------------------------------------

    def _pick_faults(self, final: bool) -> None:
        """The fault scenario of the next server life (``--faults``; none for the final one)."""
        if not self.faults:
            return
        self.scenario, rules = ("none", []) if final else fault_scenario(self.rng)
        self.scenarios[self.scenario] += 1
        assert self.server.env is not None
        self.server.env[FAULTS_ENV] = json.dumps(rules)

    def _start(self, final: bool = False) -> None:
        began = time.monotonic()
        self._pick_faults(final)
        while True:
            try:
                self.server.start()
            except ServerStartError as exc:
                text = str(exc)
                if self.scenario != "none":  # the fault hit the start-up: a new life, no fault
                    if "exited with 99" in text:
                        self.injected_crashes += 1
                    else:
                        self.refused_under_fault.append(f"{self.scenario}: {text[-300:]}")
                    self.scenario = "none"
                    assert self.server.env is not None
                    self.server.env[FAULTS_ENV] = "[]"
                    continue
                self.start_failures.append(text[-500:])
                if len(self.start_failures) > 3:
                    raise
                continue
            self.restart_s.append(time.monotonic() - began)
            self.port = self.server.port
            return

    def _collect_stats(self) -> None:
        """Add this run's journal counters (rotations, compactions) to the totals."""
        try:
            conn = Conn(self.port)
            conn.send(b"stats\r\n")
            while (line := conn.line()) != b"END":
                _, key, value = line.decode().split(" ", 2)
                for word in ("journal_rotations", "journal_rewrites"):
                    if key.endswith(word):
                        self.journal_stats[word] += int(value)
                if key.startswith("journal_files_") and key != "journal_files_limit":
                    if key == "journal_files_open":  # a level: the most seen
                        key = "most_journal_files_open"
                        value = str(max(self.journal_stats[key], int(value)))
                        self.journal_stats[key] = 0
                    self.journal_stats[key] += int(value)  # counts: summed over the lives
                for word in ("items", "mem_items"):
                    if key in (f"queue_{q}_{word}" for q in QUEUES):
                        most = f"most_{word}_at_a_kill"
                        self.journal_stats[most] = max(self.journal_stats[most], int(value))
            conn.close()
        except (Dead, ValueError):
            pass

    def run(self) -> dict[str, object]:
        self._start()
        workers = []
        for g in self.groups:
            workers += [threading.Thread(target=self.producer, args=(g, p)) for p in range(2)]
            workers += [threading.Thread(target=f, args=(g,)) for f in self._consumers()]
        if self.emfile:
            workers.append(threading.Thread(target=self.idle_crowd))
        self.producing.set()
        self.consuming.set()
        for w in workers:
            w.start()
        deadline = time.monotonic() + self.seconds
        while time.monotonic() < deadline:
            # Consumers pause for about a third of the periods: the backlog grows past the
            # memory limit (read-behind), then drains through it.
            (self.consuming.set if self.rng.random() < 0.65 else self.consuming.clear)()
            time.sleep(self.rng.uniform(0.3, 4.0))
            self._collect_stats()
            self._end_life()
            self._start()
        self.producing.clear()
        self.consuming.set()
        time.sleep(1.0)  # let the consumers take some more, then stop everything
        self.stop.set()
        for w in workers:
            w.join()
        self._collect_stats()
        self._end_life()
        self._start(final=True)
        drained = {g: sum(self._drain(g, q) for q in names) for g, names in self.groups.items()}
        self._collect_stats()
        code = self.server.stop()
        return self._summary(drained, code)

    def _end_life(self) -> None:
        """kill -9 the server, unless an injected crash (exit 99) ended it already."""
        proc = self.server.proc
        code = proc.poll() if proc is not None else None
        if code is None:
            self.server.kill()
            self.kills += 1
            return
        self.server.kill()  # reaps it
        if code == 99:
            self.injected_crashes += 1
        else:
            self.unexpected_exits.append(code)

    def _consumers(self) -> list[Callable[[str], None]]:
        kinds: list[Callable[[str], None]] = [self.plain, self.reliable, self.leaser]
        return kinds if self.plain_gets else kinds[1:]

    def _drain(self, group: str, queue: str) -> int:
        """Take every item left in one of a group's queues with plain gets (pipelined 100 at
        a time)."""
        conn = Conn(self.port)
        ledger = self.ledgers[group]
        n = 0
        while True:
            conn.send(b"get %s\r\n" % queue.encode() * 100)
            got = [conn.value() for _ in range(100)]
            for data in got:
                if data is not None:
                    ledger.received.append(data)
                    ledger.completed.append((data, "drain"))
                    n += 1
            if None in got:
                conn.close()
                return n

    # ---- accounting ---------------------------------------------------------------------

    def _summary(self, drained: dict[str, int], stop_code: int) -> dict[str, object]:
        queues: dict[str, dict[str, object]] = {}
        bad = 0
        for q, led in self.ledgers.items():
            sent = set(led.sent)
            acked = set(led.acked)
            seen = Counter(led.received)
            done = Counter(data for data, _ in led.completed)
            lost = len(acked - set(seen))
            unexplained = max(0, lost - led.interrupted_plain_gets)
            dup_completed = sum(1 for n in done.values() if n > 1)
            again = {data for data, n in seen.items() if n > 1}
            unexplained_dup = len(again - set(led.unconfirmed))
            phantom = len(set(seen) - sent)
            queues[q] = {
                "sync_journal": QUEUES.get(q, "false"),
                "queues": len(self.groups[q]),
                "sent": len(sent),
                "acknowledged": len(acked),
                "unacknowledged_sets": len(sent - acked),
                "unacknowledged_delivered": len((sent - acked) & set(seen)),
                "completed": dict(Counter(kind for _, kind in led.completed)),
                "final_drain": drained[q],
                "lost": lost,
                "interrupted_plain_gets": led.interrupted_plain_gets,
                "unexplained_lost": unexplained,
                "unconfirmed_reads": len(led.unconfirmed),
                "redelivered": len(again),
                "unexplained_redelivered": unexplained_dup,
                "duplicate_completed": dup_completed,
                "phantom": phantom,
                "sets_refused_under_fault": led.refused,
                "set_errors": led.errors[:5],
            }
            bad += unexplained + unexplained_dup + dup_completed + phantom + len(led.errors)
        log = self.server.log()
        bugs = tracebacks(log)
        n_bugs = sum(bugs.values())
        check = subprocess.run(
            [sys.executable, "-m", "tercel", "journal", "check", str(self.server.data_dir)],
            capture_output=True,
            text=True,
            check=False,
        )
        bad += n_bugs + len(self.start_failures) + (check.returncode != 0) + (stop_code != 0)
        bad += len(self.unexpected_exits)
        lines = {key: log.count(text) for key, text in LOG_LINES.items()}
        if self.emfile:  # out of descriptors must never fail a journal for good
            bad += lines["journals_failed_out_of_descriptors"]
        return {
            "ok": bad == 0,
            "seconds": self.seconds,
            "compiled_modules": compiled_modules(log),
            "kills": self.kills,
            "faults": dict(self.scenarios) if self.faults else None,
            "injected_crashes": self.injected_crashes,
            "emfile": dict(self.crowd, open_files=OPEN_FILES) if self.emfile else None,
            "start_refused_under_fault": self.refused_under_fault,
            "unexpected_exits": self.unexpected_exits,
            "startup_failures": len(self.start_failures),
            "startup_failure_logs": self.start_failures,
            "restart_s_mean": round(sum(self.restart_s) / len(self.restart_s), 3),
            "restart_s_max": round(max(self.restart_s), 3),
            "journal": dict(self.journal_stats),
            "torn_tails_logged": log.count("torn tail"),
            "log_lines": lines,
            "tracebacks_in_log": n_bugs,
            "distinct_tracebacks": [{"count": n, "where": k} for k, n in bugs.most_common()],
            "journal_check_exit": check.returncode,
            "clean_stop_exit": stop_code,
            "queues": queues,
        }


def main() -> int:
    ap = argparse.ArgumentParser(description="tercel soak: kill -9 under load, then account")
    ap.add_argument("--seconds", type=float, default=120.0, help="load time (then the drain)")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--data-dir", help="default: a new temporary directory")
    ap.add_argument("--out", help="also write the JSON summary here")
    ap.add_argument(
        "--no-plain-gets",
        action="store_true",
        help="consume with reliable reads and leases only: then lost must be exactly 0",
    )
    ap.add_argument(
        "--emfile",
        action="store_true",
        help=f"run the server under ulimit -n {OPEN_FILES} with {MANY_QUEUES} more queues and "
        f"a churning crowd of {CROWD} idle connections: EMFILE on accept and on journal opens",
    )
    ap.add_argument(
        "--faults",
        action="store_true",
        help="each server life gets an injected fault (bench/faulty_serve.py): a crash at a "
        "write, fsync or rename, a full disk, EIO on fsync, a slow disk, or none",
    )
    args = ap.parse_args()
    data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="tercel-soak-"))
    print(f"soak: {args.seconds:.0f} s, seed {args.seed}, data in {data_dir}", file=sys.stderr)
    if args.emfile and args.faults:
        ap.error("--emfile and --faults are separate runs")
    soak = Soak(
        data_dir,
        args.seconds,
        args.seed,
        plain=not args.no_plain_gets,
        faults=args.faults,
        emfile=args.emfile,
    )
    summary = soak.run()
    summary["seed"] = args.seed
    summary["plain_gets"] = not args.no_plain_gets
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if not summary["ok"]:
        print(f"soak: FAILED (data kept in {data_dir})", file=sys.stderr)
        return 1
    print("soak: ok", file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
