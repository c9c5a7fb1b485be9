"""The public testing API (docs/testing.md): ``tercel.testing`` and ``tercel.journal.faults``
export what the page documents, and the fault launcher's rules build the faults they say."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from recorder import Recorder

import tercel.testing
from tercel.errors import JournalWriteError
from tercel.journal import FileJournal
from tercel.journal import faults as faults_module
from tercel.journal.files import DataDir
from tercel.testing import FaultyFiles, faults_from_rules


@pytest.mark.parametrize("module", [tercel.testing, faults_module])
def test_all_names_the_public_surface(module: object) -> None:
    names = module.__all__  # type: ignore[attr-defined]
    assert len(set(names)) == len(names)
    for name in names:
        assert getattr(module, name) is not None
    page = (Path(__file__).parents[2] / "docs" / "testing.md").read_text()
    assert [n for n in names if f"`{n}" not in page] == []  # every name is documented


def test_rules_as_the_launcher_reads_them() -> None:
    faults = faults_from_rules(
        [
            {"kind": "fail", "op": "fdatasync", "errno": "EIO", "skip": 2, "times": 1},
            {"kind": "crash", "op": "rename", "path": "~~", "after": True},
            {"kind": "slow", "op": "pwritev", "seconds": 0.5, "path": "q"},
            {"kind": "fail", "op": "open", "errno": "EMFILE", "until": ["open", "/release"]},
        ]
    )
    fail, crash, slow, until = faults.rules
    assert (fail.op, fail.error, fail.skip, fail.times) == ("fdatasync", errno.EIO, 2, 1)
    assert (crash.op, crash.path, crash.crash) == ("rename", "~~", "after")
    assert (slow.op, slow.delay, slow.path) == ("pwritev", 0.5, "q")
    assert until.disarmed_by == ("open", "/release")
    with pytest.raises(ValueError, match="unknown fault kind"):
        faults_from_rules([{"kind": "melt", "op": "open"}])


def test_the_in_process_example(tmp_path: Path) -> None:
    faults = FaultyFiles()
    files = DataDir(str(tmp_path), ops=faults)
    journal = FileJournal(str(tmp_path), "orders", directory=files)
    journal.replay(Recorder())
    journal.add(1, 1, 0, b"kept")
    faults.fail("pwritev", errno.ENOSPC, path="orders")
    with pytest.raises(JournalWriteError):
        journal.add(2, 2, 0, b"refused")  # written through: no owner's group commit
    assert journal.failed and faults.calls["pwritev"] == 2
    journal.close()
