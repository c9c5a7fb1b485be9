"""The ready order of a tube, ``(pri, id)``, against a model, whatever mix of puts, reserves,
releases, buries, kicks and deletes comes (the ready run and heap of ``Tube``, with their
stale entries, must always yield the smallest ready job)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tercel.clock import ManualClock
from tercel.core.tubes import JobStore

PRIS = st.sampled_from([0, 1, 5, 1023, 1024, 2**31, 2**32 - 1])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), PRIS),
        st.tuples(st.just("reserve"), st.just(0)),
        st.tuples(st.just("release"), PRIS),
        st.tuples(st.just("bury"), PRIS),
        st.tuples(st.just("kick"), st.integers(1, 3)),
        st.tuples(st.just("delete"), st.just(0)),
        st.tuples(st.just("peek"), st.just(0)),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_reserve_takes_the_smallest_pri_then_id(ops: list[tuple[str, int]]) -> None:
    store = JobStore(ManualClock())
    worker = store.connect(lambda job, why: None)
    ready: dict[int, int] = {}  # id -> pri
    buried: list[int] = []  # FIFO
    held: list[int] = []
    for op, arg in ops:
        if op == "put":
            job = store.put(worker, arg, 0, 60, b"x")
            ready[job.id] = arg
        elif op == "reserve":
            job, _ = store.reserve(worker, 0)
            want = min(ready, key=lambda i: (ready[i], i)) if ready else None
            assert (None if job is None else job.id) == want
            if want is not None:
                del ready[want]
                held.append(want)
        elif op == "peek":
            job = store.peek_ready(worker)
            want = min(ready, key=lambda i: (ready[i], i)) if ready else None
            assert (None if job is None else job.id) == want
        elif op in ("release", "bury", "delete") and held:
            jid = held.pop(len(held) // 2)
            if op == "release":
                assert store.release(worker, jid, arg, 0)
                ready[jid] = arg
            elif op == "bury":
                assert store.bury(worker, jid, arg)
                buried.append(jid)
            else:
                assert store.delete(worker, jid)
        elif op == "kick":
            kicked = store.kick(worker, arg)
            assert kicked == min(arg, len(buried))
            for jid in buried[:kicked]:
                ready[jid] = store.jobs[jid].pri
            del buried[:kicked]
    while ready:  # everything left comes out in order
        job, _ = store.reserve(worker, 0)
        want = min(ready, key=lambda i: (ready[i], i))
        assert job is not None and job.id == want
        del ready[want]
    assert store.reserve(worker, 0) == (None, 1)


def test_a_long_fifo_with_returns_in_between() -> None:
    """Past the run's compaction point, released jobs still come back to their places."""
    store = JobStore(ManualClock())
    worker = store.connect(lambda job, why: None)
    ids = [store.put(worker, 7, 0, 60, b"x").id for _ in range(400)]
    taken = []
    for _ in range(300):
        job, _ = store.reserve(worker, 0)
        assert job is not None
        taken.append(job.id)
    assert taken == ids[:300]
    for jid in taken[250:200:-3] + taken[10:20]:
        assert store.release(worker, jid, 7, 0)
    more = [store.put(worker, 7, 0, 60, b"x").id for _ in range(5)]
    want = sorted(taken[250:200:-3] + taken[10:20]) + ids[300:] + more
    got = []
    while (job := store.reserve(worker, 0)[0]) is not None:
        got.append(job.id)
    assert got == want
