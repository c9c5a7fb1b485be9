"""docs/benchmarks.md is generated: its hand-kept part must be bench/EXTRA.md, or the next full
run of ``bench/suite.py`` (which rewrites the file) would drop what was added by hand."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_standalone_results_are_kept_in_bench_extra() -> None:
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    extra = (ROOT / "bench" / "EXTRA.md").read_text()
    assert extra.startswith("## Standalone measurements")
    assert docs.endswith(extra), "edit bench/EXTRA.md and copy it to the end of the docs"
