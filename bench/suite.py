"""tercel's benchmark suite: tercel against memcached, Redis and beanstalkd, cell by cell.

Contract:
- Every cell of the plan (:mod:`scenarios`) runs once per round for each of its servers, in an
  order that rotates every round; every run gets a fresh server and data dir (:mod:`servers`).
- The server is pinned to ``--server-cpu`` and this process plus its load workers to
  ``--client-cpu`` (pinning is skipped on a single-CPU machine or with -1).
- A clean run during which other processes used more than ``--rerun-noisy`` of a CPU is run
  again, at most ``--max-reruns`` times; the quietest attempt counts and the others are kept
  in the results with status "noisy".
- Each run appends one JSON line to the results file (``--out``); at the end the Markdown
  tables (:mod:`report`) go to stdout and, with the machine and the exact command, to the
  results file's name with ``.md`` (the report docs/benchmarks.md quotes a run of record from).
- Exit status 0 means every planned run happened and reported zero errors; 1 otherwise.
  ``--allow-missing`` turns servers that are not installed into a warning.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import loadgen
import manyclients
import procstat
import replay
import report
import scenarios
import servers

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"


def _csv(kind: type, text: str) -> list[Any]:
    return [kind(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command-line options; ``--quick`` overrides the sizes of everything for a smoke run."""
    ap = argparse.ArgumentParser(prog="bench/run", description=__doc__.split("\n", 1)[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: one round, tiny cells")
    ap.add_argument(
        "--scenarios",
        default=",".join(scenarios.DEFAULT_SCENARIOS),
        help=f"comma list of: {', '.join(scenarios.ALL_SCENARIOS)}",
    )
    ap.add_argument(
        "--servers",
        default=",".join(n for n, d in servers.SERVERS.items() if not d.optional),
        help=f"comma list of: {', '.join(servers.SERVERS)}",
    )
    ap.add_argument("--sizes", default="1024,64", help="item sizes in bytes")
    ap.add_argument("--conns", default="1,32", help="connection counts")
    ap.add_argument("--depths", default="1,16", help="pipeline depths (1 = none)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=2.0, help="measured seconds per cell")
    ap.add_argument("--warmup", type=float, default=0.5, help="unmeasured seconds per cell")
    ap.add_argument("--procs", type=int, default=1, help="load-generator processes per cell")
    ap.add_argument("--consumers", type=int, default=500, help="many-clients: blocked consumers")
    ap.add_argument(
        "--trickle-rate",
        type=float,
        default=1000.0,
        help="many-clients: items per second from the producer",
    )
    ap.add_argument(
        "--replay-items",
        type=int,
        default=200_000,
        help="replay: items filled before the crash (1000000 for the 1M goal)",
    )
    ap.add_argument(
        "--drop-caches",
        action="store_true",
        help="replay: drop the page cache before restarting (root)",
    )
    ap.add_argument(
        "--prefill-mb",
        type=int,
        default=96,
        help="dequeue: largest backlog per segment, below tercel's memory window",
    )
    ap.add_argument(
        "--rerun-noisy",
        type=float,
        default=0.25,
        help="run a server's cell again when other processes used more than this share of "
        "a CPU during it",
    )
    ap.add_argument("--max-reruns", type=int, default=2, help="reruns per run (0 = never)")
    ap.add_argument("--server-cpu", type=int, default=1)
    ap.add_argument("--client-cpu", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="JSON-lines results file")
    # Accepted and ignored: the report is always written beside the results (the runs of record
    # in docs/benchmarks.md quote their commands with it).
    ap.add_argument("--no-docs", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--no-snapshot",
        action="store_true",
        help="run the live src/tercel instead of a copy taken at start",
    )
    ap.add_argument(
        "--allow-missing",
        action="store_true",
        help="skip servers that are not installed instead of failing",
    )
    a = ap.parse_args(argv)
    if a.quick:
        a.rounds = 1
        a.duration = min(a.duration, 0.2)
        a.warmup = min(a.warmup, 0.05)
        a.sizes = "1024"
        a.conns = "4"
        a.depths = "4"
        a.consumers = min(a.consumers, 50)
        a.trickle_rate = min(a.trickle_rate, 200.0)
        a.replay_items = min(a.replay_items, 2000)
        a.prefill_mb = min(a.prefill_mb, 8)
    return a


def _pin(cpu: int) -> int | None:
    """Validates a CPU number: None when pinning is off or impossible here."""
    if cpu < 0 or (os.cpu_count() or 1) < 2 or cpu >= (os.cpu_count() or 1):
        return None
    return cpu


def _guess_rate(conns: int, depth: int) -> float:
    """A first guess of a dequeue rate, to size the first prefill (later rounds use the memo)."""
    if conns == 1 and depth == 1:
        return 15_000.0
    if depth == 1:
        return 100_000.0
    return 150_000.0 if conns == 1 else 300_000.0


class Runner:
    """Runs cells and keeps the state shared between them (prefill memo, work dir)."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.server_cpu = _pin(a.server_cpu)
        self.client_cpu = _pin(a.client_cpu)
        self.workdir = RESULTS / "tmp" / f"work-{os.getpid()}"
        self.rate_memo: dict[tuple[str, str], float] = {}

    def run(self, cell: scenarios.Cell, sdef: servers.ServerDef) -> dict[str, Any]:
        """One server in one cell: a result record without the bookkeeping fields."""
        if cell.scenario == "replay":
            return replay.run_replay(
                sdef,
                self.workdir,
                self.server_cpu,
                items=cell.conns,
                size=cell.size,
                drop_caches=self.a.drop_caches,
            )
        r = servers.start(sdef, self.workdir, self.server_cpu)
        try:
            if cell.scenario == "many-clients":
                rec = manyclients.run_many_clients(
                    sdef.proto,
                    r.port,
                    consumers=cell.conns,
                    size=cell.size,
                    rate=self.a.trickle_rate,
                    duration=self.a.duration,
                    cpu=self.client_cpu,
                    server_pid=r.pid,
                )
            else:
                rec = self._load(cell, sdef, r).as_dict()
            rec["peak_rss_kb"] = r.peak_rss_kb()
            if not r.alive():
                rec["errors"] = int(rec["errors"]) + 1
                rec["error_samples"] = [*rec["error_samples"], f"server died: {r.log_tail(3)}"]
        finally:
            r.cleanup()
        return rec

    def _load(
        self, cell: scenarios.Cell, sdef: servers.ServerDef, r: servers.Running
    ) -> loadgen.LoadResult:
        op = cell.scenario
        if op == "reliable" and sdef.proto != "mc":
            op = "dequeue"  # beanstalkd's reserve + delete is its reliable read
        spec = loadgen.LoadSpec(
            proto=sdef.proto,
            port=r.port,
            op=op,
            size=cell.size,
            conns=cell.conns,
            depth=cell.depth,
            procs=self.a.procs,
            warmup=self.a.warmup,
            duration=self.a.duration,
            cpu=self.client_cpu,
            tls=sdef.tls,
        )
        if op not in ("dequeue", "reliable"):
            return loadgen.run_load(spec, r.pid)
        if sdef.kind == "memcached":  # a key get: one item, never drained
            loadgen.fill(sdef.proto, r.port, 1, cell.size, tls=sdef.tls)
            return loadgen.run_load(spec, r.pid)
        return self._drain(cell, sdef, r, spec)

    def _drain(
        self,
        cell: scenarios.Cell,
        sdef: servers.ServerDef,
        r: servers.Running,
        spec: loadgen.LoadSpec,
    ) -> loadgen.LoadResult:
        """Dequeue from a prefilled queue, in segments: fill (unmeasured), drain (measured),
        until ``duration`` seconds of draining are measured. Each backlog stays below
        ``--prefill-mb`` so tercel serves it from memory."""
        key = (sdef.name, cell.key)
        cap = max(1000, min(400_000, self.a.prefill_mb * 2**20 // cell.size))
        parts: list[loadgen.LoadResult] = []
        measured = 0.0
        retries = 0
        while measured < self.a.duration * 0.98 and len(parts) < 40:
            remaining = self.a.duration - measured
            est = self.rate_memo.get(key, _guess_rate(cell.conns, cell.depth))
            n = int(min(cap, max(2000, est * (remaining + 0.1) * 1.3)))
            # warm up on at most a fifth of the backlog, so it cannot drain before counting
            seg_warm = min(self.a.warmup, 0.1, 0.2 * n / est)
            errors, _ = loadgen.fill(sdef.proto, r.port, n, cell.size, tls=sdef.tls)
            seg = replace(spec, warmup=seg_warm, duration=remaining, stop_on_miss=True)
            res = loadgen.run_load(seg, r.pid)
            if res.dry_in_warmup and res.errors == 1 and retries < 3:
                retries += (
                    1  # faster than guessed: drain what is left, retry with a shorter warm-up
                )
                self.rate_memo[key] = est * 4
                loadgen.run_load(replace(seg, warmup=0.0, duration=30.0))
                continue
            if errors:
                res.errors += errors
                res.error_samples.append(f"{errors} errors during prefill")
            parts.append(res)
            if res.errors or not res.ops:
                break
            measured += res.elapsed_s
            self.rate_memo[key] = res.ops_per_s
        return loadgen.merge_results(parts)


def machine_meta(a: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """What the report says about this machine and run."""
    model, mem_kb = procstat.machine()
    repo = BENCH.parent
    git = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(repo), "status", "--porcelain", "--", "src"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {
        "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "mem_gb": mem_kb / 2**20,
        "kernel": platform.release(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "versions": servers.versions(),
        "git": git + (" (src/ has uncommitted changes)" if dirty else ""),
        "command": "bash bench/run" + ("" if not argv else " " + shlex.join(argv)),
        "rounds": a.rounds,
        "warmup": a.warmup,
        "duration": a.duration,
        "server_cpu": a.server_cpu,
        "client_cpu": a.client_cpu,
    }


def _progress(i: int, total: int, rec: dict[str, Any]) -> str:
    if rec["status"] not in ("ok", "noisy"):
        detail = rec.get("reason") or "; ".join(rec.get("error_samples") or [])
        return f"[{i}/{total}] r{rec['round']} {rec['cell']:<28} {rec['server']:<15} " + (
            f"{rec['status'].upper()}: {str(detail)[:150]}"
        )
    if rec["scenario"] == "replay":
        what = f"first dequeue {rec['replay_first_s']:.2f} s after restart"
    else:
        cpu = report.cpu_us_per_op(rec)
        what = (
            f"{rec['ops_per_s']:>9.0f} ops/s  p99 {rec['p99_us']:>8.0f} µs  "
            f"cpu {cpu if cpu is not None else float('nan'):5.1f} µs/op"
        )
    noise = report.noise_share(rec)
    if noise is not None:
        again = "  (noisy: run again)" if rec["status"] == "noisy" else ""
        what += f"  noise {noise:4.0%}{again}"
    return f"[{i}/{total}] r{rec['round']} {rec['cell']:<28} {rec['server']:<15} {what}"


def main(argv: list[str] | None = None) -> int:
    """Runs the suite; see the module docstring for outputs and exit status."""
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    t_start = time.monotonic()
    wanted = _csv(str, a.servers)
    unknown = [s for s in wanted if s not in servers.SERVERS]
    if unknown:
        print(f"unknown server(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    plan = scenarios.build_plan(
        _csv(str, a.scenarios),
        _csv(int, a.sizes),
        _csv(int, a.conns),
        _csv(int, a.depths),
        wanted,
        consumers=a.consumers,
        replay_items=a.replay_items,
    )
    missing = {n: why for n in wanted if (why := servers.available(servers.SERVERS[n]))}
    for n, why in missing.items():
        print(f"warning: {n} unavailable: {why}", file=sys.stderr)
    runner = Runner(a)
    meta = machine_meta(a, argv)  # the commit and tree state of the code the snapshot takes
    if not a.no_snapshot and servers.snapshot_tercel(runner.workdir):
        print("tercel: running a snapshot of src/tercel taken now", file=sys.stderr)
    if runner.client_cpu is not None:
        os.sched_setaffinity(0, {runner.client_cpu})
    today = dt.date.today().isoformat()
    out = a.out or (
        RESULTS / "tmp" / f"quick-{today}.jsonl" if a.quick else RESULTS / f"{today}.jsonl"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    run_id = dt.datetime.now().isoformat(timespec="seconds")
    total = a.rounds * sum(len(c.servers) or 1 for c in plan)
    print(f"{len(plan)} cells, {total} server runs, results -> {out}", file=sys.stderr)
    records: list[dict[str, Any]] = []
    failed = 0
    i = 0
    with open(out, "a") as f:
        for rnd in range(1, a.rounds + 1):
            for cell in plan:
                names = list(cell.servers)
                k = (rnd - 1) % len(names) if names else 0
                for name in names[k:] + names[:k] or [""]:
                    i += 1
                    rec: dict[str, Any] = {}
                    for rec in _attempts(runner, cell, name, missing, a):
                        rec.update(run=run_id, round=rnd)
                        records.append(rec)
                        f.write(json.dumps(rec) + "\n")
                        f.flush()
                        print(_progress(i, total, rec), file=sys.stderr)
                    if rec["status"] == "error" or (
                        rec["status"] == "unavailable" and name and not a.allow_missing
                    ):
                        failed += 1
    shutil.rmtree(runner.workdir, ignore_errors=True)
    print(report.tables(records))
    print(report.goals(records))
    meta["wall_s"] = time.monotonic() - t_start
    meta["results"] = os.path.relpath(out, BENCH.parent)
    report.write_report(out.with_suffix(".md"), records, meta)
    print(f"wrote {out.with_suffix('.md')}", file=sys.stderr)
    print(
        f"{len(records)} runs, {failed} failed, {time.monotonic() - t_start:.0f} s",
        file=sys.stderr,
    )
    return 1 if failed else 0


def _attempts(
    runner: Runner,
    cell: scenarios.Cell,
    name: str,
    missing: dict[str, str],
    a: argparse.Namespace,
) -> list[dict[str, Any]]:
    """One server in one cell, run again while the host was busy: a clean run whose noise
    (:func:`report.noise_share`) is above ``--rerun-noisy`` is repeated, at most
    ``--max-reruns`` times. Of the clean attempts the quietest keeps status "ok" and comes
    last; the others get status "noisy" (kept in the results, left out of the tables)."""
    runs = [_one(runner, cell, name, missing, a)]
    while len(runs) <= a.max_reruns and _too_noisy(runs[-1], a.rerun_noisy):
        runs.append(_one(runner, cell, name, missing, a))
    clean = [r for r in runs if r["status"] == "ok"]
    if len(runs) == 1 or not clean:
        return runs
    best = min(clean, key=lambda r: report.noise_share(r) or 0.0)
    for r in clean:
        if r is not best:
            r["status"] = "noisy"
    return [*(r for r in runs if r is not best), best]


def _too_noisy(rec: dict[str, Any], limit: float) -> bool:
    noise = report.noise_share(rec)
    return rec["status"] == "ok" and noise is not None and noise > limit


def _one(
    runner: Runner,
    cell: scenarios.Cell,
    name: str,
    missing: dict[str, str],
    a: argparse.Namespace,
) -> dict[str, Any]:
    """Runs (or explains why it cannot run) one server in one cell; returns the full record."""
    base: dict[str, Any] = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "cell": cell.key,
        "scenario": cell.scenario,
        "size": cell.size,
        "conns": cell.conns,
        "depth": cell.depth,
        "server": name,
        "class": servers.SERVERS[name].durability if name else "",
        "warmup": a.warmup,
        "duration": a.duration,
    }
    if name in missing:
        return {**base, "status": "unavailable", "reason": missing[name]}
    try:
        rec = runner.run(cell, servers.SERVERS[name])
    except Exception as e:
        return {**base, "status": "error", "errors": 1, "reason": f"{type(e).__name__}: {e}"}
    status = "ok" if not rec.get("errors") else "error"
    return {**base, "status": status, **rec}


if __name__ == "__main__":
    sys.exit(main())
