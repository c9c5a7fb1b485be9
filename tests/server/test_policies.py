"""Queue policies through the memcache protocol: fanout, aliases, expiry (commands and the
background sweep), max_queue_age, and reload with good and bad files (command and SIGHUP).

Nothing here depends on how long anything takes: expired items are set with a negative
exptime (already expired, Kestrel's rule), and what the background sweep does is awaited by
polling ``dump_stats``, never by sleeping.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import Raw
from tercel.testing import ServerProcess

CONFIG = """
[server]
expiration_timer_frequency = 0

[queues.orders]
max_items = 3

[queues.feed]
fanout_only = true

[queues.swept]
max_expire_sweep = 2

[queues.src]
expire_to_queue = "dlq"

[aliases]
both = ["left", "right"]
fan = ["orders"]
"""


def set_cmd(q: str, data: bytes, exptime: int = 0) -> bytes:
    return b"set %s 0 %d %d\r\n%s\r\n" % (q.encode(), exptime, len(data), data)


def get(raw: Raw, q: str, expected: bytes | None) -> None:
    if expected is None:
        raw.call(b"get %s\r\n" % q.encode(), b"END\r\n")
    else:
        raw.call(
            b"get %s\r\n" % q.encode(),
            b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (q.encode(), len(expected), expected),
        )


def lines_until_end(raw: Raw, request: bytes) -> list[bytes]:
    raw.send(request)
    lines = [raw.read_line()]
    while lines[-1] != b"END\r\n":
        lines.append(raw.read_line())
    return lines


def queue_stats(raw: Raw, q: str) -> dict[str, str]:
    lines = lines_until_end(raw, b"dump_stats %s\r\n" % q.encode())
    out = {}
    for line in lines[1:-2]:
        k, _, v = line.decode().strip().partition("=")
        out[k] = v
    return out


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess(tmp_path_factory.mktemp("data"), CONFIG) as s:
        yield s


@pytest.fixture
def raw(srv: ServerProcess) -> Raw:
    return Raw(srv.connect())


# ---- fanout --------------------------------------------------------------------------------


def test_fanout_child_starts_empty_and_gets_later_items(raw: Raw) -> None:
    raw.call(set_cmd("news", b"before"), b"STORED\r\n")
    get(raw, "news+a", None)  # the reference creates and registers the child
    raw.call(set_cmd("news", b"after"), b"STORED\r\n")
    get(raw, "news+a", b"after")
    get(raw, "news+a", None)
    get(raw, "news", b"before")
    get(raw, "news", b"after")
    raw.call(set_cmd("news+a", b"direct"), b"STORED\r\n")  # a child can be set directly
    get(raw, "news", None)
    get(raw, "news+a", b"direct")
    assert b"STAT queue_news_children news+a\r\n" in lines_until_end(raw, b"stats\r\n")


def test_deleting_a_child_stops_its_feed_until_it_is_referenced_again(raw: Raw) -> None:
    get(raw, "del+x", None)
    get(raw, "del+y", None)
    raw.call(set_cmd("del", b"1"), b"STORED\r\n")
    raw.call(b"delete del+x\r\n", b"DELETED\r\n")
    raw.call(set_cmd("del", b"2"), b"STORED\r\n")
    assert queue_stats(raw, "del")["children"] == "del+y"
    get(raw, "del+x", None)  # re-created empty: it missed 1 (deleted) and 2
    raw.call(set_cmd("del", b"3"), b"STORED\r\n")
    get(raw, "del+x", b"3")
    for item in (b"1", b"2", b"3"):
        get(raw, "del+y", item)


def test_children_inherit_the_parent_config_and_the_reply_is_the_parents(raw: Raw) -> None:
    get(raw, "orders+audit", None)
    config = lines_until_end(raw, b"dump_config\r\n")
    block = config[config.index(b"queue 'orders+audit' {\r\n") :]
    assert b"  max_items=3\r\n" in block
    for i in range(3):
        raw.call(set_cmd("orders", b"%d" % i), b"STORED\r\n")
    get(raw, "orders+audit", b"0")  # the child has room again, the parent has none
    raw.call(set_cmd("orders", b"3"), b"NOT_STORED\r\n")
    assert queue_stats(raw, "orders+audit")["items"] == "3"
    raw.call(b"flush orders\r\nflush orders+audit\r\n", b"END\r\nEND\r\n")


def test_fanout_only_parent_keeps_nothing(raw: Raw) -> None:
    raw.call(set_cmd("feed", b"lost"), b"STORED\r\n")  # no children: a black hole
    get(raw, "feed+one", None)
    get(raw, "feed+two", None)
    raw.call(set_cmd("feed", b"x"), b"STORED\r\n")
    get(raw, "feed", None)
    get(raw, "feed+one", b"x")
    get(raw, "feed+two", b"x")
    # The children inherit fanout_only but store normally.
    raw.call(set_cmd("feed+one", b"y"), b"STORED\r\n")
    get(raw, "feed+one", b"y")


# ---- aliases -------------------------------------------------------------------------------


def test_alias_writes_to_each_destination_and_reads_empty(raw: Raw) -> None:
    raw.call(set_cmd("both", b"hi"), b"STORED\r\n")
    get(raw, "left", b"hi")
    get(raw, "right", b"hi")
    get(raw, "both", None)
    raw.call(b"get both/t=60000\r\n", b"END\r\n")  # never waits
    raw.call(b"get both/open\r\n", b"END\r\n")
    raw.call(b"get both/peek\r\n", b"END\r\n")


def test_alias_delete_and_flush_are_ignored(raw: Raw) -> None:
    raw.call(set_cmd("both", b"kept"), b"STORED\r\n")
    raw.call(b"delete both\r\nflush both\r\n", b"DELETED\r\nEND\r\n")
    get(raw, "left", b"kept")
    get(raw, "right", b"kept")


def test_alias_to_a_fanout_parent_feeds_its_children(raw: Raw) -> None:
    get(raw, "orders+viaalias", None)
    raw.call(set_cmd("fan", b"f"), b"STORED\r\n")
    get(raw, "orders", b"f")
    get(raw, "orders+viaalias", b"f")


# ---- expiry --------------------------------------------------------------------------------


def expired_behind_a_head(raw: Raw, q: str, n: int, then: bytes = b"") -> None:
    """Queue ``n`` already expired items (negative exptime) and take away the live head
    they hid behind: an add drops expired items only at the head."""
    raw.call(set_cmd(q, b"head"), b"STORED\r\n")
    raw.call(b"".join(set_cmd(q, b"%d" % i, -1) for i in range(n)), b"STORED\r\n" * n)
    if then:
        raw.call(set_cmd(q, then), b"STORED\r\n")
    get(raw, q, b"head")


def test_an_add_drops_expired_items_at_the_head(raw: Raw, qname: str) -> None:
    raw.call(set_cmd(qname, b"old", exptime=-1), b"STORED\r\n")
    assert queue_stats(raw, qname)["items"] == "1"
    raw.call(set_cmd(qname, b"new"), b"STORED\r\n")
    assert queue_stats(raw, qname)["expired_items"] == "1"
    get(raw, qname, b"new")


def test_get_and_peek_drop_expired_items_at_the_head(raw: Raw, qname: str) -> None:
    q = qname.encode()
    expired_behind_a_head(raw, qname, 1, then=b"new")
    raw.call(b"get %s/peek\r\n" % q, b"VALUE %s/peek 0 3\r\nnew\r\nEND\r\n" % q)
    assert queue_stats(raw, qname)["expired_items"] == "1"
    get(raw, qname, b"new")
    expired_behind_a_head(raw, qname, 2, then=b"newer")
    get(raw, qname, b"newer")
    assert queue_stats(raw, qname)["expired_items"] == "3"


def test_stats_never_expire_items(raw: Raw, qname: str) -> None:
    expired_behind_a_head(raw, qname, 2)
    for _ in range(2):
        lines = lines_until_end(raw, b"stats\r\n")
        assert b"STAT queue_%s_items 2\r\n" % qname.encode() in lines
        assert b"STAT queue_%s_expired_items 0\r\n" % qname.encode() in lines
        assert queue_stats(raw, qname)["items"] == "2"
    raw.call(b"flush_expired %s\r\n" % qname.encode(), b"2\r\n")
    raw.call(b"flush_expired %s\r\n" % qname.encode(), b"0\r\n")


def test_flush_expired_is_bounded_by_max_expire_sweep(raw: Raw) -> None:
    expired_behind_a_head(raw, "swept", 5)
    for n in (2, 2, 1, 0):
        raw.call(b"flush_expired swept\r\n", b"%d\r\n" % n)
    raw.call(b"flush_expired never_made\r\n", b"0\r\n")


def test_expire_to_queue_moves_items_without_expiry(raw: Raw) -> None:
    raw.call(set_cmd("src", b"late", -1) + set_cmd("src", b"fresh"), b"STORED\r\n" * 2)
    get(raw, "dlq", b"late")  # the add moved it
    get(raw, "src", b"fresh")
    expired_behind_a_head(raw, "src", 2)
    raw.call(b"flush_all_expired\r\n", b"2\r\n")
    get(raw, "dlq", b"0")
    get(raw, "dlq", b"1")


# ---- the background sweep and max_queue_age (real time, awaited by polling) ----------------


def wait_for(raw: Raw, q: str, key: str, value: str) -> dict[str, str]:
    for _ in range(5000):
        stats = queue_stats(raw, q)
        if stats.get(key) == value:
            return stats
    raise AssertionError(f"{q}: {key} never became {value}: {stats}")


def test_background_sweep_expires_bounded_and_deletes_old_queues(tmp_path: Path) -> None:
    config = """
[server]
expiration_timer_frequency = "5ms"

[queues.bounded]
max_expire_sweep = 1

[queues.temp]
max_queue_age = "20ms"
"""
    with ServerProcess(tmp_path / "data", config) as srv:
        raw = Raw(srv.connect())
        expired_behind_a_head(raw, "bounded", 3)
        raw.call(set_cmd("temp", b"keep me"), b"STORED\r\n")
        wait_for(raw, "bounded", "expired_items", "3")
        # temp is older than its max_queue_age but holds an item: it stays.
        get(raw, "temp", b"keep me")
        for _ in range(5000):
            if not queue_stats(raw, "temp"):  # gone: dump_stats shows an empty block
                break
        else:
            raise AssertionError("temp was never deleted")
        lines = lines_until_end(raw, b"stats\r\n")
        assert b"STAT queue_expires 1\r\n" in lines
        assert not any(line.startswith(b"STAT queue_temp_") for line in lines)


# ---- reload --------------------------------------------------------------------------------


def dump_config(raw: Raw, q: str) -> list[bytes]:
    lines = lines_until_end(raw, b"dump_config\r\n")
    start = lines.index(b"queue '%s' {\r\n" % q.encode())
    return lines[start : lines.index(b"}\r\n", start)]


def test_reload_applies_good_files_and_refuses_bad_ones(tmp_path: Path) -> None:
    path = tmp_path / "tercel.toml"
    path.write_text("[server]\nexpiration_timer_frequency = 0\n[queues.q]\nmax_items = 1\n")
    with ServerProcess(tmp_path / "data", extra_args=("--config", str(path))) as srv:
        raw = Raw(srv.connect())
        raw.call(set_cmd("q", b"1") + set_cmd("q", b"2"), b"STORED\r\nNOT_STORED\r\n")
        path.write_text('[queues.q]\nmax_items = 2\n[aliases]\nal = ["q", "r"]\n')
        raw.call(b"reload\r\n", b"Reloaded config.\r\n")
        raw.call(set_cmd("al", b"2"), b"STORED\r\n")
        get(raw, "r", b"2")
        raw.call(set_cmd("q", b"3"), b"NOT_STORED\r\n")
        # A bad file (unknown key, alias cycle, unparsable) is refused with its reason and
        # the old config stays in force.
        for text, reason in (
            ("[queues.q]\nmax_itemz = 5\n", b"queues.q: unknown key 'max_itemz'"),
            ('[aliases]\na = ["b"]\nb = ["a"]\n', b"aliases: cycle a -> b -> a"),
            ("[queues\n", b""),
        ):
            path.write_text(text)
            raw.send(b"reload\r\n")
            line = raw.read_line()
            assert line.startswith(b"SERVER_ERROR reload refused: " + reason), line
        assert b"  max_items=2\r\n" in dump_config(raw, "q")
        raw.call(set_cmd("al", b"x"), b"NOT_STORED\r\n")  # q is full, r took it
        get(raw, "r", b"x")


def test_sighup_reloads_and_a_bad_file_keeps_the_old_config(tmp_path: Path) -> None:
    path = tmp_path / "tercel.toml"
    path.write_text("[server]\nexpiration_timer_frequency = 0\n")
    with ServerProcess(tmp_path / "data", extra_args=("--config", str(path))) as srv:
        assert srv.proc is not None
        raw = Raw(srv.connect())
        get(raw, "hup", None)
        path.write_text("[queues.hup]\nmax_items = 7\n")
        srv.proc.send_signal(signal.SIGHUP)
        for _ in range(5000):
            if b"  max_items=7\r\n" in dump_config(raw, "hup"):
                break
        else:
            raise AssertionError("SIGHUP did not reload")
        path.write_text("[queues.hup]\nmax_items = -1\n")
        srv.proc.send_signal(signal.SIGHUP)
        for _ in range(5000):
            if "reload refused" in srv.log():
                break
        else:
            raise AssertionError("the bad file was not refused")
        assert b"  max_items=7\r\n" in dump_config(raw, "hup")
