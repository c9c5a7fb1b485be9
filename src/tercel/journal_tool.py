"""``tercel journal dump|check|compact|salvage``: look at and repair journals offline.

``dump`` prints every record (like Kestrel's qdump), ``check`` verifies every checksum and
reports the first bad offset per file (of the beanstalkd job log too: ``beanstalk.d`` in the
data dir, or a ``tercel beanstalkd -b`` directory with ``--jobs``), ``compact`` replays a queue
and rewrites its history into one snapshot, ``salvage`` cuts the damaged spans out of a queue's
files and keeps every valid record around them (:mod:`tercel.journal.salvage`). Each shows a
progress bar on large journals and exits non-zero when a journal is corrupt. ``compact`` and
``salvage`` refuse to run while a server holds the data directory. Exit codes: 0 fine, 1 a
journal is corrupt (or was), 2 a usage error: not a directory, no such queue, an invalid name,
the directory in use.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Never, TextIO

from tercel.journal import list_queue_names
from tercel.journal import records as rec
from tercel.journal.checkpoint import SUFFIX as CHECKPOINT_SUFFIX
from tercel.journal.journal import journal_files
from tercel.journal.reader import ChunkReader
from tercel.names import valid_name

if TYPE_CHECKING:  # the rest is imported when used: `tercel serve` starts without it
    from tqdm import tqdm

    from tercel.storage import DataDirLock

PROGRESS_OVER = 16 * 1024 * 1024
"""Show a progress bar when the files to read add up to more than this."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``tercel journal ...`` on the main parser."""
    journal = sub.add_parser("journal", help="inspect, check or compact journal files offline")
    verbs = journal.add_subparsers(dest="verb", required=True)
    dump = verbs.add_parser("dump", help="print every record")
    dump.add_argument("dir")
    dump.add_argument("queue", nargs="?")
    dump.add_argument("--payload", action="store_true", help="print payloads as escaped text")
    check = verbs.add_parser("check", help="verify every record; non-zero exit on corruption")
    check.add_argument("dir")
    check.add_argument("queue", nargs="?")
    check.add_argument(
        "--jobs", action="store_true", help="DIR is a beanstalkd job log (tercel beanstalkd -b)"
    )
    compact = verbs.add_parser("compact", help="compact journals (server must be stopped)")
    compact.add_argument("dir")
    compact.add_argument("queue", nargs="?")
    compact.add_argument("--config", help="the server's config (for per-queue settings)")
    salvage = verbs.add_parser(
        "salvage", help="cut damaged spans, keep every valid record (server must be stopped)"
    )
    salvage.add_argument("dir")
    salvage.add_argument("queue")
    salvage.add_argument("--dry-run", action="store_true", help="report only, change nothing")


def run(args: argparse.Namespace) -> int:
    """Run the verb; the exit code."""
    if not os.path.isdir(args.dir):
        print(f"{args.dir}: not a directory", file=sys.stderr)
        return 2
    if args.verb == "check" and getattr(args, "jobs", False):
        return check_job_log(args.dir, sys.stdout)
    if args.queue is not None and not _exists(args.dir, args.queue):
        return 2
    if args.verb == "dump":
        return dump(args.dir, args.queue, args.payload, sys.stdout)
    if args.verb == "check":
        return check(args.dir, sys.stdout, args.queue)
    if args.verb == "salvage":
        return salvage(args.dir, args.queue, sys.stdout, dry_run=args.dry_run)
    return compact(args.dir, args.queue, args.config, sys.stdout)


def _exists(data_dir: str, queue: str) -> bool:
    """True when ``queue`` is a valid name with journal files in ``data_dir``; else says why
    on stderr (so a typo is not an empty, successful dump)."""
    if not valid_name(queue):
        print(f"{queue!r}: not a valid queue name", file=sys.stderr)
        return False
    if not journal_files(data_dir, queue):
        print(f"{queue}: no such queue in {data_dir}", file=sys.stderr)
        return False
    return True


def _queues(data_dir: str, queue: str | None) -> list[str]:
    return [queue] if queue else list_queue_names(data_dir)


def _lock(data_dir: str) -> DataDirLock | None:
    """Take the data directory's one lock (:mod:`tercel.storage`, the one a running server
    and the embedded queues hold); None (and a message) when anything else holds it."""
    from tercel.errors import ConfigError
    from tercel.storage import DataDirLock

    try:
        return DataDirLock.exclusive(data_dir)
    except ConfigError:
        print(
            f"{data_dir} is in use by a running tercel (a server, a tool or an embedded "
            "queue); stop it first",
            file=sys.stderr,
        )
        return None


def _bar(paths: list[str], desc: str) -> tqdm[Never]:
    from tqdm import tqdm

    total = sum(os.path.getsize(p) for p in paths)
    return tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        desc=desc,
        disable=total < PROGRESS_OVER or not sys.stderr.isatty(),
        file=sys.stderr,
    )


def _records(path: str, bar: tqdm[Never]) -> Iterator[dict[str, object]]:
    """Every record of one file, described; raises BadRecord at the first bad one."""
    with open(path, "rb") as fh:
        head = fh.read(rec.HEADER_SIZE)
    if rec.header_version(head) is None:
        raise rec.BadRecord(0, "bad file header")
    reader = ChunkReader(path, rec.HEADER_SIZE)
    try:
        last = reader.offset
        while (span := reader.next()) is not None:
            desc = rec.describe_record(reader.buffer, *span)
            desc["offset"] = reader.file_offset(span[0])
            bar.update(reader.offset - last)
            last = reader.offset
            yield desc
        reader.check_end()
    finally:
        reader.close()


def _ms(value: object) -> str:
    if not isinstance(value, int) or value == 0:
        return "-"
    return datetime.datetime.fromtimestamp(value / 1000, datetime.UTC).isoformat(
        timespec="milliseconds"
    )


def dump(data_dir: str, queue: str | None, payload: bool, out: TextIO) -> int:
    """Print every record of the queues' journals."""
    status = 0
    for name in _queues(data_dir, queue):
        paths = journal_files(data_dir, name)
        with _bar(paths, name) as bar:
            for path in paths:
                out.write(f"# {path}\n")
                try:
                    for r in _records(path, bar):
                        out.write(_format(r, payload) + "\n")
                except rec.BadRecord as bad:
                    out.write(f"!! bad record at offset {bad.offset}: {bad.reason}\n")
                    status = 1
    return status


def _format(r: dict[str, object], payload: bool) -> str:
    parts = [f"{r['offset']:>10}", f"{r['op']:<8}"]
    if "key" in r:  # ADD_KEYED, DEDUP_KEY and the keyed leases' records
        parts.append(f"key={r['key']}")
    if r["op"] in ("ADD", "ADD_KEYED"):
        data = r["data"]
        assert isinstance(data, bytes)
        parts += [f"id={r['item_id']}", f"size={len(data)}", f"added={_ms(r['add_time'])}"]
        parts.append(f"expiry={_ms(r['expiry'])}")
        if payload:
            parts.append(repr(data[:200]) + ("..." if len(data) > 200 else ""))
    elif "xid" in r:
        parts.append(f"xid={r['xid']}")
    if r["op"] == "SNAPSHOT":
        parts.append(f"next_id={r['next_id']}")
    if r["op"] == "RESUME":
        parts += [f"cursor={r['cursor']}", f"taken={r['taken']}"]
    for name in ("item_id", "lease_file", "count", "max_items", "how"):
        if name in r and r["op"] not in ("ADD", "ADD_KEYED"):
            parts.append(f"{name}={r[name]}")
    for name in ("put_time", "created_at", "expires_at"):
        if name in r:
            parts.append(f"{name}={_ms(r[name])}")
    return " ".join(parts)


def check(data_dir: str, out: TextIO, queue: str | None = None) -> int:
    """Verify every record of every journal (or of ``queue``'s) and, without ``queue``, of
    the beanstalkd job log in ``beanstalk.d`` when there is one; 1 when any file is damaged."""
    from tercel.journal.joblog import SERVE_DIR

    jobs = os.path.join(data_dir, SERVE_DIR)
    status = check_job_log(jobs, out) if queue is None and os.path.isdir(jobs) else 0
    for name in _queues(data_dir, queue):
        paths = journal_files(data_dir, name)
        with _bar(paths, name) as bar:
            for path in paths:
                count = 0
                try:
                    for _ in _records(path, bar):
                        count += 1
                except rec.BadRecord as bad:
                    good = f"{count} good records before"
                    out.write(f"{path}: BAD at offset {bad.offset}: {bad.reason} ({good})\n")
                    status = 1
                else:
                    out.write(f"{path}: ok, {count} records\n")
    return status


def check_job_log(directory: str, out: TextIO) -> int:
    """Verify every file of the beanstalkd job log in ``directory`` (``snapshot.<n>`` and
    ``jobs.<n>``, in order), record by record as a start frames them (journal_format.md §17);
    1 when any file is damaged. A bad record at the end of the newest ``jobs`` file is one a
    start cuts as a torn tail; it is reported all the same, as a queue journal's is."""
    from tercel.journal.joblog import JOBS_PREFIX, SNAP_PREFIX
    from tercel.journal.jobrecords import check_file

    files = sorted(
        (int(name[len(prefix) :]), prefix == JOBS_PREFIX, name)
        for name in os.listdir(directory)
        for prefix in (SNAP_PREFIX, JOBS_PREFIX)
        if name.startswith(prefix) and name[len(prefix) :].isdigit()
    )
    if not files:
        out.write(f"{directory}: no job log files\n")
    status = 0
    for _, _, name in files:
        path = os.path.join(directory, name)
        with open(path, "rb") as fh:
            count, bad, why = check_file(fh.read())
        if bad >= 0:
            out.write(f"{path}: BAD at offset {bad}: {why} ({count} good records before)\n")
            status = 1
        else:
            out.write(f"{path}: ok, {count} records\n")
    return status


def compact(data_dir: str, queue: str | None, config_path: str | None, out: TextIO) -> int:
    """Replay each queue and rewrite its journal into one snapshot."""
    from tercel.clock import SystemClock
    from tercel.config import ServerConfig, load_config
    from tercel.errors import JournalCorrupt
    from tercel.storage import open_queue

    config = load_config(config_path) if config_path else ServerConfig()
    lock = _lock(data_dir)
    if lock is None:
        return 2
    names = _queues(data_dir, queue)
    try:
        with _bar([p for n in names for p in journal_files(data_dir, n)], "compact") as bar:
            for name in names:
                before = sum(os.path.getsize(p) for p in journal_files(data_dir, name))
                q = open_queue(data_dir, name, config.queue_config(name), SystemClock())
                try:
                    q.replay()
                except JournalCorrupt as exc:
                    print(f"{name}: {exc}", file=sys.stderr)
                    return 1
                q.compact()
                q.close()
                after = sum(os.path.getsize(p) for p in journal_files(data_dir, name))
                bar.update(before)
                out.write(f"{name}: {len(q)} items, {before} -> {after} bytes\n")
    finally:
        lock.release()
    return 0


def salvage(data_dir: str, queue: str, out: TextIO, *, dry_run: bool = False) -> int:
    """Cut the damaged spans out of ``queue``'s files, keep every valid record, report what was
    cut; 0 when nothing was damaged, 1 when something was cut (or would be, ``dry_run``)."""
    from tercel.journal.salvage import salvage_queue

    lock = _lock(data_dir)
    if lock is None:
        return 2
    try:
        paths = journal_files(data_dir, queue)
        with _bar(paths, queue) as bar:
            result = salvage_queue(
                _with_seqs(paths),
                write=not dry_run,
                progress=bar.update,
                checkpoint=os.path.join(data_dir, queue + CHECKPOINT_SUFFIX),
            )
    finally:
        lock.release()
    for fp in result.files:
        kept = len(fp.keep)
        if not fp.damaged:
            out.write(f"{fp.path}: ok, {kept} records\n")
            continue
        cut = sum(c.stop - c.start for c in fp.cuts)
        out.write(f"{fp.path}: {kept} records kept, {cut} bytes cut in {len(fp.cuts)} spans\n")
        for c in fp.cuts:
            what = f" (its header says: {c.guess})" if c.guess else ""
            out.write(f"  cut [{c.start}, {c.stop}) {c.stop - c.start} bytes: {c.reason}{what}\n")
    for note in result.resumes:
        out.write(f"  moved {note}\n")
    if result.damaged:
        verb = "would keep" if dry_run else "kept"
        out.write(f"{queue}: salvaged; the originals are {verb} as <file>.damaged-<ms>\n")
        return 1
    out.write(f"{queue}: nothing to salvage\n")
    return 0


def _with_seqs(paths: list[str]) -> list[tuple[int, str]]:
    """``(seq, path)`` of a queue's files in replay order: ``<name>.<n>`` has seq n, the
    current file one more than the newest of them (docs/journal_format.md §1)."""
    seqs = [int(p.rsplit(".", 1)[1]) for p in paths[:-1]]
    last = paths[-1]
    tail = int(last.rsplit(".", 1)[1]) if "." in os.path.basename(last) else None
    if tail is not None:
        seqs.append(tail)
    else:
        seqs.append(seqs[-1] + 1 if seqs else 1)
    return list(zip(seqs, paths, strict=True))
