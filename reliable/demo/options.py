"""The flags of ``reliable demo`` as one object, and the guard/sweeper timings the demo runs with."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reliable.demo import groups as groups_mod
from reliable.demo.cluster import ClusterShape
from reliable.demo.errors import DemoError


@dataclass
class DemoOptions:
    """The flags of ``reliable demo`` (see ``reliable demo --help`` and docs/demo.md)."""

    messages: int = 2000
    consumers: int = 3
    groups: int = groups_mod.DEFAULT_GROUPS
    db: str | None = None
    redis: str | None = None
    chaos: bool = False
    seed: int = 1
    json: bool = False
    workdir: Path = field(default_factory=lambda: Path("var"))
    report: bool = True
    timeout_s: float = 600.0
    mode: str = "auto"
    accounts: int = 1000
    queues: int = 4
    batch: int = 25
    sweep_interval_s: float = 1.0
    #: ``--brokers N --slaves M --replication …``: run on a broker_sim cluster (None: one broker)
    cluster: ClusterShape | None = None

    def validate(self) -> None:
        if self.messages <= 0:
            raise DemoError("--messages must be > 0")
        if self.consumers <= 0:
            raise DemoError("--consumers must be > 0")
        if self.groups <= 0:
            raise DemoError("--groups must be > 0")
        if self.mode not in ("auto", "process", "inprocess"):
            raise DemoError(f"--mode must be auto, process or inprocess, not {self.mode!r}")
        if self.timeout_s <= 0:
            raise DemoError("--timeout must be > 0")
        if self.cluster is not None:
            self.cluster.validate()
            if self.mode == "inprocess":
                raise DemoError("--brokers/--slaves run every broker as a process: not with --mode inprocess")


#: guard/sweeper settings scaled down so faults heal in seconds instead of minutes (docs/demo.md)
DEMO_SETTINGS: dict[str, Any] = {
    "lease_ms": 3000,
    "first_resend_delay_s": 3.0,
    "stuck_after_s": 8.0,
    "max_sends": 10,
}
