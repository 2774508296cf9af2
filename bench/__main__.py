"""``python -m bench [NAME ...]``: run every ``bench/bench_*.py`` (or the named ones) in turn.

``python -m bench NAME --option …``: one bench with its own options (everything from the first argument that
starts with ``-`` goes to that bench's ``main``)."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    here = Path(__file__).parent
    first_option = next((i for i, a in enumerate(argv) if a.startswith("-")), len(argv))
    names, options = argv[:first_option], argv[first_option:]
    if options and len(names) != 1:
        raise SystemExit(
            "python -m bench: options go to one named bench, e.g. `python -m bench remoting --n 500`"
        )
    names = names or sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))
    for name in names:
        module = importlib.import_module(f"bench.{name if name.startswith('bench_') else 'bench_' + name}")
        print(f"== {module.__name__}")
        module.main(options)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
