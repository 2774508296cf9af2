"""Evaluating a parsed SQL92 selector against a message's properties, with Java's three-valued logic.

Each node yields True, False or None (unknown). A missing property is None; a comparison with None is None;
``AND`` is False as soon as one side is False, ``OR`` True as soon as one side is True, otherwise None if a
side is None; ``NOT None`` is None. A message matches only when the whole expression is True
(``ExpressionMessageFilter.isMatchedByCommitLog``); an evaluation error (a property that does not parse as
the number it is compared with) is logged and the message does not match, as in the broker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from broker_sim.filter.sql92 import Between, Compare, Const, In, IsNull, Logic, Node, Prop, Unary, parse
from broker_sim.filter.values import EvaluationError, Num, Value, java_compare, java_equals, parse_number

log = logging.getLogger(__name__)

_ORDER: dict[str, Callable[[int], bool]] = {
    ">": lambda c: c > 0,
    ">=": lambda c: c >= 0,
    "<": lambda c: c < 0,
    "<=": lambda c: c <= 0,
}


def _not(value: bool | None) -> bool | None:
    return None if value is None else not value


def _equal(lv: Value, rv: Value) -> bool | None:
    """``ComparisonExpression.doCreateEqual``: null on the left is unknown, on the right only false."""
    if (lv is None) != (rv is None):
        return None if lv is None else False
    if lv is None or java_equals(lv, rv):
        return True
    return java_compare(lv, rv) == 0


def _order(op: str, lv: Value, rv: Value) -> bool | None:
    if lv is None or rv is None:
        return None
    if isinstance(lv, str) and isinstance(rv, str):  # Java compares two strings as doubles, or throws
        return _ORDER[op](java_compare(parse_number(lv, "double"), parse_number(rv, "double")))
    return _ORDER[op](java_compare(lv, rv))


def value_of(node: Node, props: Mapping[str, str]) -> Value:
    """The Java value of a node (booleans for conditions)."""
    if isinstance(node, Const):
        return node.value
    if isinstance(node, Prop):
        return props.get(node.name)
    if isinstance(node, Unary) and node.op == "-":
        v = value_of(node.operand, props)
        return Num(v.kind, -v.value) if isinstance(v, Num) else None
    return truth(node, props)


def truth(node: Node, props: Mapping[str, str]) -> bool | None:
    """Three-valued truth of a condition."""
    if isinstance(node, Logic):
        left = truth(node.left, props)
        if node.op == "AND":
            if left is False:
                return False
            right = truth(node.right, props)
            return False if right is False else (None if left is None or right is None else True)
        if left is True:
            return True
        right = truth(node.right, props)
        return True if right is True else (None if left is None or right is None else False)
    if isinstance(node, Unary):  # NOT (the parser only lets boolean operands through)
        return _not(truth(node.operand, props))
    if isinstance(node, Compare):
        lv, rv = value_of(node.left, props), value_of(node.right, props)
        if node.op == "=":
            return _equal(lv, rv)
        if node.op == "<>":
            return _not(_equal(lv, rv))
        return _order(node.op, lv, rv)
    if isinstance(node, Between):
        v, lo, hi = (value_of(n, props) for n in (node.value, node.low, node.high))
        if node.negated:
            return truth(Logic("OR", Const(_order("<", v, lo)), Const(_order(">", v, hi))), props)
        return truth(Logic("AND", Const(_order(">=", v, lo)), Const(_order("<=", v, hi))), props)
    if isinstance(node, In):
        value = props.get(node.prop.name)
        return None if value is None else (value in node.values) != node.negated
    if isinstance(node, IsNull):
        is_null = _equal(value_of(node.operand, props), None)
        return _not(is_null) if node.negated else is_null
    if isinstance(node, Prop):  # a property used as a condition: Java's boolean cast
        return None if node.name not in props else False
    constant = node.value
    return constant if constant is None or isinstance(constant, bool) else False


class Sql92Filter:
    """A compiled selector: ``matches(properties)`` is True only when the expression evaluates to TRUE."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        self.tree = parse(expression)

    def matches(self, properties: Mapping[str, str]) -> bool:
        try:
            return truth(self.tree, properties) is True
        except EvaluationError as exc:
            log.warning("SQL92 filter %r failed on a message (%s): not matched", self.expression, exc)
            return False

    def __repr__(self) -> str:
        return f"Sql92Filter({self.expression!r})"


def compile_sql92(expression: str) -> Sql92Filter:
    """Parse once, evaluate per message; :class:`~broker_sim.filter.sql92.Sql92Error` for a bad expression."""
    return Sql92Filter(expression)
