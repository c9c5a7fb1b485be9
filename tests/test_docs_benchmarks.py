"""docs/benchmarks.md stays a page a user reads in five minutes: short, with its runs of record
named by date, commit and command, and pointing only at benchmark scripts that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "benchmarks.md"
INVESTIGATIONS = "## Investigations"


def test_benchmarks_page_is_short() -> None:
    assert len(DOCS.read_text().splitlines()) < 400


def test_every_run_of_record_names_its_date_commit_and_command() -> None:
    text = DOCS.read_text()
    records = text.split("## Runs of record", 1)[1].split("\n## ", 1)[0]
    sections = records.split("\n### ")[1:]
    assert sections
    for section in sections:
        title = section.splitlines()[0]
        assert re.search(r"20\d\d-\d\d-\d\d", section), title
        assert re.search(r"commit `[0-9a-f]{7,}`", section), title
        assert re.search(r"`(bash bench/run|[^`]*bench/[a-z_]+\.py)[^`]*`", section), title


def test_scripts_named_outside_investigations_exist() -> None:
    # One-off investigations name scripts of an older commit; everything else must run here.
    text = DOCS.read_text().split(INVESTIGATIONS, 1)[0]
    for name in ("benchmarks.md", "spark.md", "reliability.md"):
        page = DOCS.with_name(name).read_text() if name != "benchmarks.md" else text
        for script in set(re.findall(r"bench/([a-z_]+\.py)", page)):
            if name != "benchmarks.md" and _in_investigation(page, script):
                continue
            assert (ROOT / "bench" / script).exists(), f"{name} names bench/{script}"


def _in_investigation(page: str, script: str) -> bool:
    """spark.md and reliability.md may name a removed script in a paragraph that says which
    commit to check out to rerun it."""
    return all("1f1f505" in para for para in page.split("\n\n") if f"bench/{script}" in para)
