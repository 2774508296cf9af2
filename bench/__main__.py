"""``python -m bench [NAME ...]``: run every ``bench/bench_*.py`` (or the named ones) in turn."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    here = Path(__file__).parent
    names = argv or sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))
    for name in names:
        module = importlib.import_module(f"bench.{name if name.startswith('bench_') else 'bench_' + name}")
        print(f"== {module.__name__}")
        module.main([])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
