"""``python -m broker_sim`` = the ``broker-sim`` command."""

from __future__ import annotations

import sys

from broker_sim.cli import main

sys.exit(main())
