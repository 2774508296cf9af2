"""Values of the SQL92 selector and how Java compares them (``ComparisonExpression.__compare`` in 4.9.8, with
string conversion on, as ``SelectorParser.parse`` always sets it).

Message properties are strings; constants are Java Integer / Long / Double / String / Boolean. Two values of
different types are converted before comparing: numbers widen (int → long → double); a string next to a
number is parsed as that number's type (``Integer.valueOf`` …) and a string next to a boolean becomes
``Boolean.valueOf`` (true only for "true", any case). A string that does not parse is an
:class:`EvaluationError` (Java throws, the broker logs it and the message does not match). Any other mix
compares as "less" (-1), exactly as Java's fall-through does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from broker_sim.errors import BrokerSimError


class EvaluationError(BrokerSimError):
    """A comparison Java would throw on (e.g. a property that is not a number compared with a number)."""


@dataclass(frozen=True)
class Num:
    """A numeric constant with Java's type: ``int`` (Integer), ``long`` (Long) or ``double`` (Double)."""

    kind: str
    value: int | float


Value = Num | str | bool | None

_RANK = {"int": 0, "long": 1, "double": 2}
_INT = re.compile(r"[+-]?\d+\Z")
_DOUBLE = re.compile(r"[+-]?(?:NaN|Infinity|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[fFdD]?)\Z")
_BOUNDS = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}


def parse_number(text: str, kind: str) -> Num:
    """``Integer.valueOf`` / ``Long.valueOf`` / ``Double.valueOf`` of a property value."""
    if kind == "double":
        s = text.strip()
        if not _DOUBLE.match(s):
            raise EvaluationError(f"{text!r} is not a double")
        return Num("double", float(s.rstrip("fFdD").replace("Infinity", "inf")))
    if not _INT.match(text):
        raise EvaluationError(f"{text!r} is not an {'integer' if kind == 'int' else 'long'}")
    value = int(text)
    lo, hi = _BOUNDS[kind]
    if not lo <= value <= hi:
        raise EvaluationError(f"{text!r} is out of range for {kind}")
    return Num(kind, value)


def _cmp(a: int | float | str | bool, b: int | float | str | bool) -> int:
    return (a > b) - (a < b)  # type: ignore[operator]


def java_compare(lv: Value, rv: Value) -> int:
    """``__compare(lv, rv, true)``; both operands non-null."""
    if isinstance(lv, Num) and isinstance(rv, Num):
        return _cmp(lv.value, rv.value)  # widening keeps the value
    if isinstance(lv, str) and isinstance(rv, str):
        return _cmp(lv, rv)
    if isinstance(lv, bool) and isinstance(rv, bool):
        return _cmp(lv, rv)
    if isinstance(lv, bool):
        if isinstance(rv, str):
            raise EvaluationError("a boolean cannot be compared with a string")  # Java's ClassCastException
        return -1
    if isinstance(lv, Num):
        if isinstance(rv, str):
            return _cmp(lv.value, parse_number(rv, lv.kind).value)
        return -1
    if isinstance(lv, str):
        if isinstance(rv, bool):
            return _cmp(lv.lower() == "true", rv)
        if isinstance(rv, Num):
            return _cmp(parse_number(lv, rv.kind).value, rv.value)
    return -1


def java_equals(lv: Value, rv: Value) -> bool:
    """``Object.equals`` of the two Java values (an Integer never equals a Long or a Double)."""
    if isinstance(lv, Num) and isinstance(rv, Num):
        return lv.kind == rv.kind and lv.value == rv.value
    return type(lv) is type(rv) and lv == rv
