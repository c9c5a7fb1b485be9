"""``tercel serve`` with faults injected through the journal's file seam (for ``bench/soak.py``).

Run as ``python bench/faulty_serve.py serve ARGS...``: the same as ``python -m tercel.testing
serve ARGS...`` (:data:`tercel.testing.FAULTY_LAUNCHER`), which reads the rules from
``TERCEL_SOAK_FAULTS`` (:func:`tercel.testing.faults_from_rules`) and, with
``TERCEL_POWER_LOSS_SHADOW`` set, records what a power cut would leave. Kept as a path for the
scripts that name it.
"""

from __future__ import annotations

import sys

from tercel.testing import run_with_faults

if __name__ == "__main__":
    sys.exit(run_with_faults(sys.argv[1:]))
