"""``python -m tercel`` is the ``tercel`` command."""

import sys

if sys.argv[1:2] == ["beanstalkd"]:  # bind before loading the rest (tercel.beanstalkd_cli)
    from tercel.beanstalkd_cli import main as beanstalkd

    raise SystemExit(beanstalkd(sys.argv[2:]))

from tercel.cli import main

raise SystemExit(main())
