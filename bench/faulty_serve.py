"""``tercel serve`` with faults injected through the journal's file seam (for ``bench/soak.py``).

Run as ``python bench/faulty_serve.py serve ARGS...``: it reads the rules from the environment
variable ``TERCEL_SOAK_FAULTS`` (a JSON list), installs them with
:func:`tercel.journal.files.set_default_ops` (:class:`tercel.journal.faults.FaultyFiles`), then
runs ``tercel`` with ``ARGS`` as the command line would. A rule is an object:

- ``{"kind": "crash", "op": "pwritev", "after": true, "skip": 300}``: the process exits with
  status 99 just after (or before) that call, once;
- ``{"kind": "fail", "op": "fdatasync", "errno": "EIO", "skip": 20, "times": 1}``: the call
  raises that ``OSError``; ``"until": ["open", "/release"]`` ends the rule once such a call
  has completed (a client lifts the fault by creating the queue ``release``);
- ``{"kind": "slow", "op": "fdatasync", "seconds": 0.02}``: the call waits first.

``path`` (a substring of the file's path) may narrow any rule. With ``TERCEL_POWER_LOSS_SHADOW``
set, the seam also records what a power cut would leave (``tests/integration/test_power_cut.py``).
Production code is unchanged:
only the seam's default operations are replaced, before the server opens its data dir.
"""

from __future__ import annotations

import errno
import json
import os
import sys

from tercel.journal import files
from tercel.journal.faults import FaultyFiles, PowerLossFiles

ENV = "TERCEL_SOAK_FAULTS"


def install(rules: list[dict[str, object]]) -> FaultyFiles:
    """The rules as a :class:`FaultyFiles` (see the module docstring)."""
    faults = FaultyFiles()
    for rule in rules:
        op = str(rule["op"])
        path = str(rule["path"]) if "path" in rule else None
        skip = int(str(rule.get("skip", 0)))
        if rule["kind"] == "crash":
            faults.crash(op, path=path, after=bool(rule.get("after")), skip=skip)
        elif rule["kind"] == "fail":
            times = int(str(rule["times"])) if "times" in rule else None
            code = getattr(errno, str(rule["errno"]))
            until = rule.get("until")
            off = (str(until[0]), str(until[1])) if isinstance(until, list) else None
            faults.fail(op, code, path=path, skip=skip, times=times, disarmed_by=off)
        elif rule["kind"] == "slow":
            faults.slow(op, float(str(rule["seconds"])), path=path)
        else:
            raise ValueError(f"unknown fault kind in {rule}")
    return faults


POWER_ENV = "TERCEL_POWER_LOSS_SHADOW"
"""When set, a directory: the file seam also records what a power cut would leave of the
data dir (:class:`tercel.journal.faults.PowerLossFiles`; the test then calls
:func:`tercel.journal.faults.power_loss` after a SIGKILL)."""


def install_power_loss(ops: files.FileOps, argv: list[str]) -> files.FileOps:
    """``ops`` under a :class:`PowerLossFiles` of the ``--data-dir`` in ``argv``, when the
    environment asks for one (``TERCEL_POWER_LOSS_SHADOW``)."""
    shadow = os.environ.get(POWER_ENV)
    if not shadow:
        return ops
    data_dir = argv[argv.index("--data-dir") + 1]
    os.makedirs(data_dir, exist_ok=True)
    return PowerLossFiles(data_dir, shadow, inner=ops)


if __name__ == "__main__":
    faults = install(json.loads(os.environ.get(ENV, "[]")))
    files.set_default_ops(install_power_loss(faults, sys.argv))
    from tercel.cli import main

    sys.exit(main(sys.argv[1:]))
