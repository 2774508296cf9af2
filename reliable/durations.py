"""One grammar for a duration a person writes: ``250ms``, ``30s``, ``5m``, ``2h``, ``30d`` or bare seconds.

The sweeper's options, the reconciliation's ``--log-retention`` / ``--stuck-after`` and the ``RELIABLE_*_S``
settings all read durations; they share this parser so that a value accepted in one place is accepted in
every other (``RELIABLE_LOG_RETENTION_S=30d`` once failed where ``reliable sweep --log-retention 30d``
worked).
Callers turn the ``ValueError`` into their own error type (argparse, ``ConfigurationError``, …).
"""

from __future__ import annotations

import re

#: what a caller's error message shows as examples
DURATION_HINT = "use e.g. 250ms, 30s, 5m, 2h, 30d or a number of seconds"

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_seconds(text: str) -> float:
    """``text`` as seconds; ``ValueError`` naming the text and the accepted forms when it is not one."""
    m = _DURATION.match(str(text))
    if m is None and _DURATION.match(str(text).strip().removeprefix("-")):
        raise ValueError(f"{text!r}: a duration must not be negative")
    if m is None:
        raise ValueError(f"not a duration: {text!r} ({DURATION_HINT})")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]
