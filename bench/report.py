"""Turns result records (one dict per server per cell per round) into Markdown.

Contract:
- :func:`tables` returns one Markdown table per cell key, in first-seen order. Each row is one
  server: medians over rounds of ops/s, p50/p99/p99.9 latency, server and load-generator CPU
  µs/op, peak RSS and noise (CPU used by neither, per second), plus
  for each peer the paired ratio tercel/peer (throughput and CPU per op), computed within each
  round and reported as ``median [min-max]``. Only records with ``status == "ok"`` count.
- Replay cells report seconds to the first dequeue after restart (lower is better) instead of
  ops/s; their ratio is tercel's time over the peer's.
- :func:`write_report` writes one run's report (machine, command, goals, every table) as
  Markdown beside its raw results; docs/benchmarks.md quotes the run of record from it.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from servers import PEER_TARGETS, SERVERS


def _fmt_rate(x: float) -> str:
    if x >= 100_000:
        return f"{x / 1000:.0f} k"
    if x >= 999.5:
        return f"{x / 1000:.1f} k"
    return f"{x:.0f}"


def _fmt_us(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 10_000:
        return f"{x / 1000:.1f} ms"
    return f"{x:.0f} µs"


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _ratio_text(rs: list[float]) -> str:
    if not rs:
        return "-"
    med = statistics.median(rs)
    if len(rs) == 1:
        return f"{med:.2f}x"
    return f"{med:.2f}x [{min(rs):.2f}-{max(rs):.2f}]"


def cpu_us_per_op(rec: dict[str, Any], key: str = "server_cpu_s") -> float | None:
    """CPU µs per op of one record: the server's, or with ``key="client_cpu_s"`` the load
    generator's (it shares the machine with the server); None when not measured."""
    cpu = rec.get(key)
    ops = rec.get("ops") or 0
    if cpu is None or not ops:
        return None
    return float(cpu) * 1e6 / ops


def noise_share(rec: dict[str, Any]) -> float | None:
    """The CPU that neither the server nor the load generator used during a run's measured
    window, as a share of one CPU (0.25 = a quarter of a CPU), or None when not measured."""
    other = rec.get("other_cpu_s")
    elapsed = rec.get("elapsed_s")
    if other is None or not elapsed:
        return None
    return float(other) / float(elapsed)


def _paired(recs: list[dict[str, Any]], target: str, peer: str, metric: str) -> list[float]:
    """Per-round ratios target/peer of ``metric`` where both ran cleanly in that round."""
    by_round: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in recs:
        if r["status"] == "ok":
            by_round[r["round"]][r["server"]] = r
    out: list[float] = []
    for servers in by_round.values():
        if target in servers and peer in servers:
            a = _metric(servers[target], metric)
            b = _metric(servers[peer], metric)
            if a is not None and b:
                out.append(a / b)
    return out


def _spread(recs: list[dict[str, Any]], key: str) -> str:
    """The median of ``key`` over ``recs`` in seconds, with its range when there are several."""
    vals = [float(r[key]) for r in recs if r.get(key) is not None]
    if not vals:
        return "-"
    med = statistics.median(vals)
    if len(vals) == 1:
        return f"{med:.2f} s"
    return f"{med:.2f} s [{min(vals):.2f}-{max(vals):.2f}]"


def _metric(rec: dict[str, Any], metric: str) -> float | None:
    if metric == "cpu":
        return cpu_us_per_op(rec)
    v = rec.get(metric)
    return float(v) if v is not None else None


def _cell_table(key: str, recs: list[dict[str, Any]]) -> list[str]:
    replay = key.startswith("replay")
    order: list[str] = []
    for r in recs:
        if r["server"] not in order:
            order.append(r["server"])
    # tercel's configurations, and the TLS variants (a peer's TLS cost is its TLS twin's ratio)
    targets = [s for s in order if SERVERS[s].is_tercel or SERVERS[s].tls]
    many = key.startswith("many-clients")
    main_metric = "replay_first_s" if replay else "p99_us" if many else "ops_per_s"
    ratio_label = "p99" if many else "ops/s"
    head = (
        "| server | class | first dequeue after kill -9 | after SIGTERM | listening after "
        "| fill | on disk | peak RSS after replay | errors | tercel / peer (time, kill -9) "
        "| tercel / peer (time, SIGTERM) |"
        if replay
        else "| server | class | ops/s | p50 | p99 | p99.9 | server CPU µs/op | client CPU µs/op "
        "| peak RSS | errors | noise "
        f"| tercel / peer ({ratio_label}) | tercel / peer (CPU/op) |"
    )
    lines = [f"### {key}", ""]
    if many:
        lines += [
            "ops/s = deliveries per second at the producer's trickle rate; p50/p99 = latency "
            "from add to delivery; errors include lost or duplicated items.",
            "",
        ]
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for name in order:
        mine = [r for r in recs if r["server"] == name]
        ok = [r for r in mine if r["status"] == "ok"]
        errs = sum(int(r.get("errors") or 0) for r in mine)
        bad = [r for r in mine if r["status"] != "ok"]
        if bad and not ok:
            why = bad[0].get("reason") or "; ".join(bad[0].get("error_samples") or [])
            reason = (str(why or bad[0]["status"]).splitlines() or [""])[0][:100]
            lines.append(f"| {name} | {SERVERS[name].durability} | {reason} |")
            continue
        ratios_ops: list[str] = []
        ratios_cpu: list[str] = []
        ratios_term: list[str] = []
        for t in PEER_TARGETS.get(name, ()):
            if t in targets:
                ratios_ops.append(f"{t}: {_ratio_text(_paired(recs, t, name, main_metric))}")
                ratios_cpu.append(f"{t}: {_ratio_text(_paired(recs, t, name, 'cpu'))}")
                term = _paired(recs, t, name, "replay_term_first_s")
                ratios_term.append(f"{t}: {_ratio_text(term)}")
        rss = _median([r["peak_rss_kb"] / 1024 for r in ok if r.get("peak_rss_kb")])
        rss_s = f"{rss:.0f} MB" if rss is not None else "-"
        cls = SERVERS[name].durability
        if replay:
            listen = _median([r["replay_listen_s"] for r in ok])
            fill = _median([r["fill_s"] for r in ok])
            disk = _median([r["disk_bytes"] / 2**20 for r in ok])
            lines.append(
                f"| {name} | {cls} | {_spread(ok, 'replay_first_s')} "
                f"| {_spread(ok, 'replay_term_first_s')} "
                f"| {listen or 0:.2f} s | {fill or 0:.1f} s "
                f"| {disk or 0:.0f} MB | {rss_s} | {errs} | {'; '.join(ratios_ops) or '-'} "
                f"| {'; '.join(ratios_term) or '-'} |"
            )
            continue
        rate = _median([r["ops_per_s"] for r in ok]) or 0.0
        p50 = _median([r["p50_us"] for r in ok])
        p99 = _median([r["p99_us"] for r in ok])
        p999 = _median([r["p999_us"] for r in ok if r.get("p999_us") is not None])
        cpu = _median([c for c in (cpu_us_per_op(r) for r in ok) if c is not None])
        cpu_s = f"{cpu:.1f}" if cpu is not None else "-"
        client = _median(
            [c for c in (cpu_us_per_op(r, "client_cpu_s") for r in ok) if c is not None]
        )
        client_s = f"{client:.1f}" if client is not None else "-"
        noise = _median([n for n in (noise_share(r) for r in ok) if n is not None])
        noise_s = f"{noise:.0%}" if noise is not None else "-"
        lines.append(
            f"| {name} | {cls} | {_fmt_rate(rate)} | {_fmt_us(p50)} | {_fmt_us(p99)} "
            f"| {_fmt_us(p999)} | {cpu_s} | {client_s} | {rss_s} | {errs} | {noise_s} "
            f"| {'; '.join(ratios_ops) or '-'} | {'; '.join(ratios_cpu) or '-'} |"
        )
    return [*lines, ""]


def tables(records: Iterable[dict[str, Any]]) -> str:
    """All per-cell tables (see module docstring)."""
    cells: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        cells.setdefault(r["cell"], []).append(r)
    out: list[str] = []
    for key, recs in cells.items():
        out.extend(_cell_table(key, recs))
    return "\n".join(out)


DURABLE_GOALS = (
    # (cell, tercel config, peer, least ratio of ops/s): issue 24's restatement of the durable
    # goals, 1 KiB items over 32 connections.
    ("enqueue 1KiB c=32 d=1", "tercel-sync", "redis-always", 1.0),
    ("mixed 1KiB c=32 d=1", "tercel-sync", "redis-always", 1.0),
    ("enqueue 1KiB c=32 d=16", "tercel-sync", "beanstalkd-f0", 5.0),
    ("mixed 1KiB c=32 d=16", "tercel-sync", "beanstalkd-f0", 5.0),
)
REPLAY_GOAL = 0.5
"""Replay cells: tercel-50ms's time to the first item after a restart, at most this share of
Redis ``everysec``'s and of beanstalkd's, after kill -9 and after SIGTERM."""


def goals(records: Iterable[dict[str, Any]]) -> str:
    """The goals, each with its paired median [range] in this run and whether it holds
    there (by the median); goals whose cells did not run are listed as not measured."""
    recs = list(records)
    by_cell: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        by_cell[r["cell"]].append(r)
    rows: list[tuple[str, list[float], float, bool]] = []
    for cell, target, peer, least in DURABLE_GOALS:
        ratios = _paired(by_cell.get(cell, []), target, peer, "ops_per_s")
        rows.append((f"{cell}: {target} ops/s ≥ {least:g}x {peer}", ratios, least, True))
    for cell in (c for c in by_cell if c.startswith("replay")):
        for peer in ("redis-everysec", "beanstalkd"):
            for key, what in (("replay_first_s", "kill -9"), ("replay_term_first_s", "SIGTERM")):
                ratios = _paired(by_cell[cell], "tercel-50ms", peer, key)
                label = f"{cell}, after {what}: tercel-50ms time ≤ {REPLAY_GOAL:g}x {peer}"
                rows.append((label, ratios, REPLAY_GOAL, False))
    lines = ["| goal | paired ratio, median [range] | in this run |", "|---|---|---|"]
    for label, ratios, bound, at_least in rows:
        if not ratios:
            lines.append(f"| {label} | - | not measured |")
            continue
        med = statistics.median(ratios)
        holds = med >= bound if at_least else med <= bound
        lines.append(f"| {label} | {_ratio_text(ratios)} | {'holds' if holds else 'NOT MET'} |")
    return "\n".join(lines)


def write_report(path: Path, records: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    """Writes one run's report to ``path``: machine, exact command, goals, then every table."""
    machine = [
        f"- date: {meta['date']}",
        f"- machine: {meta['nproc']} CPUs ({meta['cpu_model']}), {meta['mem_gb']:.0f} GB RAM, "
        f"kernel {meta['kernel']}",
        f"- python: {meta['python']}",
        *(f"- {k}: {v}" for k, v in meta["versions"].items()),
        f"- tercel commit: {meta['git']}",
        f"- pinning: server on CPU {meta['server_cpu']}, load generator on CPU "
        f"{meta['client_cpu']}",
        f"- rounds: {meta['rounds']}, warm-up {meta['warmup']} s, measured {meta['duration']} s "
        f"per cell; wall time {meta['wall_s'] / 60:.1f} min",
        f"- raw results: `{meta['results']}`",
    ]
    text = "\n".join(
        [
            f"# Benchmark run {meta['date']}",
            "",
            *machine,
            "",
            "Command:",
            "",
            "```",
            meta["command"],
            "```",
            "",
            "## Goals in this run",
            "",
            goals(records),
            "",
            "## Results",
            "",
            tables(records),
        ]
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.rstrip() + "\n")
