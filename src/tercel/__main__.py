"""``python -m tercel`` is the ``tercel`` command."""

from tercel.cli import main

raise SystemExit(main())
