"""broker_sim's package layering, checked on every import statement (also those inside functions and under
TYPE_CHECKING): the broker and the clients meet only in ``common``, which imports neither; the store, the
filter and ``common`` stay below them; nothing below the network layer imports it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "broker_sim"

# package -> broker_sim packages it must never import
FORBIDDEN = {
    "client": {"broker", "remoting"},
    "broker": {"client", "remoting"},
    "common": {"broker", "client", "remoting"},
    "store": {"broker", "client", "remoting", "common", "filter"},
    "filter": {"broker", "client", "remoting", "common", "store"},
    "namesrv": {"broker", "client", "store"},
}


def imported_packages(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "broker_sim" and len(parts) > 1:
                out.add(parts[1])
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_nothing_above_it(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_packages(path) & FORBIDDEN[package])
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}
