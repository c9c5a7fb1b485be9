"""Configuration: sizes, durations, sync forms, unknown keys, per-queue resolution, files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tercel.config import (
    UNLIMITED,
    QueueConfig,
    ServerConfig,
    ServerSettings,
    load_config,
    parse_config,
    parse_duration,
    parse_size,
)
from tercel.errors import ConfigError

# ---- values --------------------------------------------------------------------------------

SIZES = [
    (0, 0),
    (1024, 1024),
    ("1024", 1024),
    ("16MB", 16 * 1024**2),
    ("16mb", 16 * 1024**2),
    ("16 MB", 16 * 1024**2),
    ("1KB", 1024),
    ("1k", 1024),
    ("1KiB", 1024),
    ("2G", 2 * 1024**3),
    ("1tb", 1024**4),
    ("10b", 10),
    ("1.5KB", 1536),
]


@pytest.mark.parametrize(("value", "expected"), SIZES)
def test_parse_size(value: object, expected: int) -> None:
    assert parse_size(value, "k") == expected


@pytest.mark.parametrize("value", [-1, "-1", "16XB", "MB", "", "1.2.3", 1.5, True, None, [1]])
def test_bad_size(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        parse_size(value, "queues.max_size")
    assert "queues.max_size" in str(info.value)


DURATIONS = [
    (0, 0),
    (250, 250),
    ("250ms", 250),
    ("1s", 1000),
    ("1sec", 1000),
    ("1.5s", 1500),
    ("5m", 300_000),
    ("5min", 300_000),
    ("2h", 7_200_000),
    ("1d", 86_400_000),
    (" 3 s ", 3000),
    ("10MS", 10),
]


@pytest.mark.parametrize(("value", "expected"), DURATIONS)
def test_parse_duration(value: object, expected: int) -> None:
    assert parse_duration(value, "k") == expected


@pytest.mark.parametrize("value", [-5, "-1s", "5", "5x", "s", "", 1.5, False, None])
def test_bad_duration(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        parse_duration(value, "server.client_timeout")
    assert "server.client_timeout" in str(info.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(False, None), (True, 0), (0, 0), ("0ms", 0), (100, 100), ("100ms", 100), ("1s", 1000)],
)
def test_sync_journal_forms(value: object, expected: int | None) -> None:
    cfg = parse_config({"queues": {"sync_journal": value}})
    assert cfg.defaults.sync_journal == expected


@pytest.mark.parametrize("value", ["sometimes", -1, 1.5])
def test_bad_sync_journal(value: object) -> None:
    with pytest.raises(ConfigError, match="sync_journal"):
        parse_config({"queues": {"sync_journal": value}})


# ---- documents -----------------------------------------------------------------------------


def test_empty_document_gives_defaults() -> None:
    cfg = parse_config({})
    assert cfg.server == ServerSettings()
    assert cfg.defaults == QueueConfig()
    assert cfg.queue_config("anything") == QueueConfig()
    assert (dict(cfg.overrides), dict(cfg.aliases), cfg.source) == ({}, {}, None)


def test_queue_defaults() -> None:
    q = QueueConfig()
    assert (q.max_items, q.max_size, q.max_item_size) == (UNLIMITED, UNLIMITED, UNLIMITED)
    assert (q.discard_old_when_full, q.journal, q.sync_journal) == (False, True, None)
    assert (q.max_age, q.expire_to_queue, q.fanout_only) == (None, None, False)


def test_full_document() -> None:
    cfg = parse_config(
        {
            "server": {
                "host": "0.0.0.0",
                "memcache_port": 0,
                "admin_port": False,
                "data_dir": "/var/spool/tercel",
                "max_open_reads": 5,
                "client_timeout": "30s",
                "expiration_timer_frequency": "1s",
                "max_connections": 0,
            },
            "queues": {
                "max_items": 1000,
                "max_age": "1h",
                "jobs": {"max_size": "1MB", "discard_old_when_full": True},
                "work": {"journal": False, "expire_to_queue": "dead", "max_age": 0},
            },
            "aliases": {"both": ["jobs", "work"]},
        }
    )
    s = cfg.server
    assert (s.host, s.memcache_port, s.admin_port, s.data_dir) == (
        "0.0.0.0",
        0,
        None,
        "/var/spool/tercel",
    )
    assert (s.max_open_reads, s.client_timeout, s.expiration_timer_frequency) == (5, 30_000, 1000)
    assert s.max_connections is None
    jobs = cfg.queue_config("jobs")
    assert (jobs.max_items, jobs.max_size, jobs.discard_old_when_full, jobs.max_age) == (
        1000,
        1024**2,
        True,
        3_600_000,
    )
    work = cfg.queue_config("work")
    assert (work.journal, work.expire_to_queue, work.max_age) == (False, "dead", None)
    assert cfg.queue_config("other") is cfg.defaults
    assert cfg.aliases == {"both": ("jobs", "work")}


def test_fanout_children_inherit_the_parent_overrides() -> None:
    cfg = parse_config(
        {
            "queues": {
                "max_items": 10,
                "a": {"max_items": 2, "fanout_only": True, "max_age": "1s"},
                "a+own": {"max_items": 5},
            }
        }
    )
    child = cfg.queue_config("a+x")
    assert (child.max_items, child.fanout_only, child.max_age) == (2, True, 1000)
    own = cfg.queue_config("a+own")
    assert (own.max_items, own.fanout_only, own.max_age) == (5, True, 1000)
    assert cfg.queue_config("b+x").max_items == 10


def test_describe() -> None:
    cfg = parse_config({"queues": {"sync_journal": "50ms", "max_age": "2s"}})
    described = dict(cfg.defaults.describe())
    assert described["sync_journal"] == "50ms"
    assert described["max_age"] == "2000"
    assert described["expire_to_queue"] == "none"
    assert described["journal"] == "true"
    assert [k for k, _ in cfg.defaults.describe()][:3] == ["max_items", "max_size", "max_item_size"]
    assert dict(QueueConfig(sync_journal=0).describe())["sync_journal"] == "true"
    assert dict(QueueConfig().describe())["sync_journal"] == "false"


def test_with_server() -> None:
    cfg = parse_config({"queues": {"max_items": 3}})
    changed = cfg.with_server(memcache_port=0, data_dir="/tmp/x")
    assert (changed.server.memcache_port, changed.server.data_dir) == (0, "/tmp/x")
    assert changed.defaults == cfg.defaults
    assert cfg.server.memcache_port == 22133


BAD_DOCS: list[tuple[dict[str, Any], str]] = [
    ({"bogus": {}}, "bogus"),
    ({"server": {"prot": 1}}, "'prot'"),
    ({"server": {"memcache_port": 70000}}, "server.memcache_port"),
    ({"server": {"memcache_port": "22133"}}, "server.memcache_port"),
    ({"server": {"host": ""}}, "server.host"),
    ({"server": {"max_open_reads": 0}}, "server.max_open_reads"),
    ({"server": {"max_open_reads": True}}, "server.max_open_reads"),
    ({"server": 3}, "[server]"),
    ({"queues": 3}, "[queues]"),
    ({"aliases": 3}, "[aliases]"),
    ({"queues": {"max_itemz": 3}}, "'max_itemz'"),
    ({"queues": {"a": {"max_itemz": 3}}}, "queues.a"),
    ({"queues": {"a": {"max_items": -1}}}, "queues.a.max_items"),
    ({"queues": {"a": {"max_items": "many"}}}, "queues.a.max_items"),
    ({"queues": {"a": {"discard_old_when_full": "yes"}}}, "queues.a.discard_old_when_full"),
    ({"queues": {"a": {"expire_to_queue": "../x"}}}, "queues.a.expire_to_queue"),
    ({"queues": {"a.b": {"max_items": 1}}}, "a.b"),
    ({"queues": {"a/b": {}}}, "a/b"),
    ({"aliases": {"a.b": ["c"]}}, "a.b"),
    ({"aliases": {"a": "b"}}, "aliases.a"),
    ({"aliases": {"a": ["b", "../c"]}}, "aliases.a"),
    ({"aliases": {"a": ["a"]}}, "cycle"),
    ({"aliases": {"a": ["b"], "b": ["c"], "c": ["a"]}}, "cycle"),
]


@pytest.mark.parametrize(("doc", "needle"), BAD_DOCS, ids=[n for _, n in BAD_DOCS])
def test_bad_documents(doc: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    assert needle in str(info.value)


def test_alias_chains_without_cycles_are_fine() -> None:
    cfg = parse_config({"aliases": {"a": ["b", "c"], "b": ["c"], "d": ["a", "b"]}})
    assert cfg.aliases["d"] == ("a", "b")


# ---- files ---------------------------------------------------------------------------------


def test_load_config(tmp_path: Path) -> None:
    path = tmp_path / "tercel.toml"
    path.write_text(
        '[server]\nmemcache_port = 0\n\n[queues]\nmax_size = "1MB"\n\n'
        '[queues.jobs]\nmax_items = 5\n\n[aliases]\nall = ["jobs", "other"]\n'
    )
    cfg = load_config(path)
    assert isinstance(cfg, ServerConfig)
    assert cfg.source == str(path)
    assert cfg.server.memcache_port == 0
    assert cfg.queue_config("jobs").max_items == 5
    assert cfg.queue_config("jobs").max_size == 1024**2
    assert cfg.aliases == {"all": ("jobs", "other")}
    assert load_config(str(path)) == cfg


def test_load_bad_toml(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[server\nport = \n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_load_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b"[queues.caf\xe9]\nmax_items = 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_load_invalid_value(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[queues.jobs]\nmax_size = "lots"\n')
    with pytest.raises(ConfigError, match=r"queues\.jobs\.max_size"):
        load_config(path)


def test_load_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "missing.toml")
    assert "missing.toml" in str(info.value)


def test_expire_to_queue_cycles_are_refused() -> None:
    doc = {"queues": {"a": {"expire_to_queue": "b"}, "b": {"expire_to_queue": "a"}}}
    with pytest.raises(ConfigError, match="expire_to_queue: cycle"):
        parse_config(doc)
    # A chain that ends, and a queue expiring to itself (ignored at run time), are fine.
    parse_config({"queues": {"a": {"expire_to_queue": "b"}, "b": {"expire_to_queue": "c"}}})
    parse_config({"queues": {"a": {"expire_to_queue": "a"}}})


def test_every_problem_is_reported_at_once_with_the_closest_key() -> None:
    doc = {
        "sever": {},
        "server": {"memcache_prot": 1, "admin_port": "x", "max_items": 3},
        "queues": {"max_itemz": 3, "jobs": {"max_size": "lots", "dead_leter_queue": "dlq"}},
        "aliases": {"a/b": ["c"]},
    }
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    text = str(info.value)
    assert "\n" not in text  # one line: it is also a reload's SERVER_ERROR reply
    assert text.startswith("8 problems: unknown table [sever] (did you mean [server]?); ")
    for needle in (
        "server: unknown key 'memcache_prot' (did you mean memcache_port?)",
        "server.admin_port: expected a port number",
        "server: unknown key 'max_items' (a queue setting)",
        "queues: unknown key 'max_itemz' (did you mean max_items?)",
        "queues.jobs.max_size: expected a size",
        "queues.jobs: unknown key 'dead_leter_queue' (did you mean dead_letter_queue?)",
        "aliases: bad alias name 'a/b': a queue name is 1-200 characters",
    ):
        assert needle in text, needle
    with pytest.raises(ConfigError) as one:
        parse_config({"queues": {"host": "x"}})
    assert str(one.value) == "queues: unknown key 'host' (a [server] setting)"


def test_a_cycle_and_another_problem_are_both_reported(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text('[server]\nhots = "x"\n[aliases]\na = ["b"]\nb = ["a"]\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert text.startswith("2 problems: server: unknown key 'hots' (did you mean host?)")
    assert "aliases: cycle a -> b -> a" in text
