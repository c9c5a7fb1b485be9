"""The benchmark matrix: which cells exist and which servers run in each.

Contract: :func:`build_plan` turns the command-line selection into an ordered list of
:class:`Cell`. A cell is one scenario at one item size, connection count and pipeline depth; it
lists the servers that run it (all of them once per round, in an order that rotates per round).

Scenarios:
- ``enqueue``, ``dequeue`` (from a prefilled queue), ``mixed`` (each connection alternates
  enqueue and dequeue, Kestrel's "flood"): every server of the ``none`` and ``periodic``
  durability classes; ``enqueue`` and ``mixed`` at 1 KiB also run the ``durable`` class.
  Items other than 1 KiB run only at the largest connection count.
- ``reliable``: Kestrel reliable reads (``get q/close/open``) on tercel; beanstalkd's dequeue
  (reserve + delete) is the same guarantee and is the comparator.
- ``many-clients``: N consumers blocked on a 1 s blocking get, one producer trickling; every item
  must be delivered exactly once. Blocking peers: Redis BLPOP, beanstalkd reserve-with-timeout.
- ``replay``: fill N items, SIGKILL, restart, time to the first successful dequeue.
"""

from __future__ import annotations

from dataclasses import dataclass

from servers import SERVERS

LOAD_SCENARIOS = ("enqueue", "dequeue", "mixed", "reliable")
SPECIAL_SCENARIOS = ("many-clients", "replay")
ALL_SCENARIOS = LOAD_SCENARIOS + SPECIAL_SCENARIOS
DEFAULT_SCENARIOS = ALL_SCENARIOS

BLOCKING_SERVERS = ("tercel-50ms", "tercel-bs-50ms", "redis-everysec", "beanstalkd")
RELIABLE_SERVERS = ("tercel-50ms", "tercel-bs-50ms", "beanstalkd")
REPLAY_SERVERS = ("tercel-50ms", "tercel-bs-50ms", "redis-everysec", "beanstalkd")


@dataclass(frozen=True)
class Cell:
    """One point of the matrix. For many-clients ``conns`` is the number of consumers and for
    replay ``conns`` is the number of items filled before the crash."""

    scenario: str
    size: int
    conns: int
    depth: int
    servers: tuple[str, ...]

    @property
    def key(self) -> str:
        """A stable human-readable id, used to group results across rounds."""
        size = f"{self.size // 1024}KiB" if self.size % 1024 == 0 else f"{self.size}B"
        if self.scenario == "many-clients":
            return f"many-clients {size} consumers={self.conns}"
        if self.scenario == "replay":
            return f"replay {size} items={self.conns}"
        return f"{self.scenario} {size} c={self.conns} d={self.depth}"


def _servers_for(scenario: str, size: int) -> tuple[str, ...]:
    if scenario == "reliable":
        return RELIABLE_SERVERS
    if scenario == "many-clients":
        return BLOCKING_SERVERS
    if scenario == "replay":
        return REPLAY_SERVERS
    durable_ok = scenario in ("enqueue", "mixed") and size == 1024
    return tuple(n for n, d in SERVERS.items() if d.durability != "durable" or durable_ok)


def build_plan(
    scenarios: list[str],
    sizes: list[int],
    conns: list[int],
    depths: list[int],
    servers: list[str],
    *,
    consumers: int,
    replay_items: int,
) -> list[Cell]:
    """The ordered cells for this run; servers not in ``servers`` are dropped, empty cells too."""
    plan: list[Cell] = []
    wanted = set(servers)

    def add(scenario: str, size: int, c: int, d: int) -> None:
        names = tuple(n for n in _servers_for(scenario, size) if n in wanted)
        if names:
            plan.append(Cell(scenario, size, c, d, names))

    for sc in scenarios:
        if sc in ("enqueue", "dequeue", "mixed"):
            for size in sizes:
                for c in conns if size == 1024 else [max(conns)]:
                    for d in depths:
                        add(sc, size, c, d)
        elif sc == "reliable":
            for c in conns:
                for d in depths:
                    add(sc, 1024 if 1024 in sizes else sizes[0], c, d)
        elif sc == "many-clients":
            add(sc, 1024 if 1024 in sizes else sizes[0], consumers, 1)
        elif sc == "replay":
            for size in sizes:
                add(sc, size, replay_items, 1)
        else:
            raise ValueError(f"unknown scenario {sc!r}; known: {', '.join(ALL_SCENARIOS)}")
    return plan
