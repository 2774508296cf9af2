"""Parser for RocketMQ 4.9.8's SQL92 message selector (the grammar of ``filter/parser/SelectorParser.jj``).

Grammar, loosest binding first (keywords case-insensitive)::

    expr       := and ( OR and )*
    and        := equality ( AND equality )*
    equality   := comparison ( ( "=" | "<>" ) comparison | IS [NOT] NULL )*
    comparison := unary ( (">" | ">=" | "<" | "<=") unary
                        | [NOT] BETWEEN unary AND unary
                        | [NOT] IN "(" string ( "," string )* ")" )*
    unary      := "+" unary | "-" unary | NOT unary | primary
    primary    := literal | identifier | "(" expr ")"
    literal    := 'string' ('' escapes a quote) | decimal [L] | float | TRUE | FALSE | NULL

Identifiers are ``[A-Za-z_$][A-Za-z0-9_$]*`` and name message properties (case-sensitive lookup). Comments
(``-- …`` and ``/* … */``) are skipped. Checks Java makes while parsing are made here too: an operand of
AND/OR/NOT or the whole expression must be boolean (a comparison, TRUE/FALSE/NULL, or a property, which is
cast); IN needs a property on its left; BETWEEN with two constants needs low ≤ high; integer literals must fit
a long; float literals must be positive-range doubles (Java rejects ``0.0``). Anything else is a
:class:`Sql92Error` naming the offending position.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from broker_sim.errors import BrokerSimError
from broker_sim.filter.values import EvaluationError, Num, Value, java_compare


class Sql92Error(BrokerSimError, ValueError):
    """An expression that does not parse (answered SUBSCRIPTION_PARSE_FAILED on the wire)."""


# -- values and tree -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Const:
    value: Value  # None is SQL NULL


@dataclass(frozen=True)
class Prop:
    name: str


@dataclass(frozen=True)
class Unary:
    op: str  # "NOT" or "-"
    operand: Node


@dataclass(frozen=True)
class Logic:
    op: str  # "AND", "OR"
    left: Node
    right: Node


@dataclass(frozen=True)
class Compare:
    op: str  # "=", "<>", ">", ">=", "<", "<="
    left: Node
    right: Node


@dataclass(frozen=True)
class Between:
    value: Node
    low: Node
    high: Node
    negated: bool = False


@dataclass(frozen=True)
class In:
    prop: Prop
    values: tuple[str, ...]
    negated: bool = False


@dataclass(frozen=True)
class IsNull:
    operand: Node
    negated: bool = False


Node = Const | Prop | Unary | Logic | Compare | Between | In | IsNull

# -- lexer ---------------------------------------------------------------------------------------------------

KEYWORDS = frozenset({"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS"})
_TOKEN = re.compile(
    r"""(?P<ws>[ \t\n\r\f]+|--[^\n\r]*(?:\r\n|\n|\r|$)|/\*.*?\*/)
      | (?P<float>\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)
      | (?P<dec>(?:0|[1-9]\d*)[lL]?)
      | (?P<str>'(?:''|[^'])*')
      | (?P<id>[A-Za-z_$][A-Za-z0-9_$]*)
      | (?P<op>>=|<=|<>|[=<>(),+-])""",
    re.VERBOSE | re.DOTALL,
)
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_DOUBLE_MIN_POSITIVE = 5e-324


@dataclass(frozen=True)
class _Tok:
    kind: str  # "kw", "id", "dec", "float", "str", "op", "end"
    text: str
    pos: int


def _tokens(text: str) -> list[_Tok]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise Sql92Error(f"unexpected character {text[pos]!r} at position {pos} in {text!r}")
        kind = m.lastgroup or "ws"
        if kind == "id" and m.group().upper() in KEYWORDS:
            out.append(_Tok("kw", m.group().upper(), pos))
        elif kind != "ws":
            out.append(_Tok(kind, m.group(), pos))
        pos = m.end()
    out.append(_Tok("end", "", len(text)))
    return out


def decimal(text: str) -> Num:
    """``ConstantExpression.createFromDecimal``: a long, narrowed to int when it fits."""
    value = int(text.rstrip("lL"))
    if not _LONG_MIN <= value <= _LONG_MAX:
        raise Sql92Error(f"integer literal {text} does not fit a long")
    return Num("int" if _INT_MIN <= value <= _INT_MAX else "long", value)


def floating(text: str) -> Num:
    """``ConstantExpression.createFloat``: a double; Java refuses values below Double.MIN_VALUE (so 0.0)."""
    value = float(text)
    if value == float("inf"):
        raise Sql92Error(f"{text} is greater than the largest double")
    if value < _DOUBLE_MIN_POSITIVE:
        raise Sql92Error(f"{text} is less than Double.MIN_VALUE (Java rejects it)")
    return Num("double", value)


# -- parser --------------------------------------------------------------------------------------------------


def is_boolean(node: Node) -> bool:
    """Whether Java treats ``node`` as a BooleanExpression (a property is cast, so it counts too)."""
    if isinstance(node, Const):
        return node.value is None or isinstance(node.value, bool)
    if isinstance(node, Unary):
        return node.op == "NOT"
    return not isinstance(node, Unary)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokens(text)
        self.i = 0

    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def _fail(self, what: str) -> Sql92Error:
        t = self.tok
        found = "end of expression" if t.kind == "end" else repr(t.text)
        return Sql92Error(f"{what} at position {t.pos}, found {found}, in {self.text!r}")

    def _accept(self, kind: str, text: str | None = None) -> bool:
        t = self.tok
        if t.kind == kind and (text is None or t.text == text):
            self.i += 1
            return True
        return False

    def _peek(self, offset: int, kind: str, text: str) -> bool:
        t = self.toks[min(self.i + offset, len(self.toks) - 1)]
        return t.kind == kind and t.text == text

    def _expect(self, kind: str, text: str, what: str) -> None:
        if not self._accept(kind, text):
            raise self._fail(f"expected {what}")

    def _boolean(self, node: Node) -> Node:
        if not is_boolean(node):
            raise Sql92Error(
                f"expression will not result in a boolean value: {render(node)} in {self.text!r}"
            )
        return node

    def parse(self) -> Node:
        node = self._boolean(self.or_())
        if self.tok.kind != "end":
            raise self._fail("unexpected input")
        return node

    def or_(self) -> Node:
        left = self.and_()
        while self._accept("kw", "OR"):
            left = Logic("OR", self._boolean(left), self._boolean(self.and_()))
        return left

    def and_(self) -> Node:
        left = self.equality()
        while self._accept("kw", "AND"):
            left = Logic("AND", self._boolean(left), self._boolean(self.equality()))
        return left

    def equality(self) -> Node:
        left = self.comparison()
        while True:
            if self.tok.kind == "op" and self.tok.text in ("=", "<>"):
                op = self.tok.text
                self.i += 1
                left = Compare(op, left, self.comparison())
            elif self._peek(0, "kw", "IS"):
                self.i += 1
                negated = self._accept("kw", "NOT")
                self._expect("kw", "NULL", "NULL after IS")
                left = IsNull(left, negated)
            else:
                return left

    def comparison(self) -> Node:
        left = self.unary()
        while True:
            t = self.tok
            if t.kind == "op" and t.text in (">", ">=", "<", "<="):
                self.i += 1
                left = Compare(t.text, left, self.unary())
            elif self._peek(0, "kw", "BETWEEN") or (
                self._peek(0, "kw", "NOT") and self._peek(1, "kw", "BETWEEN")
            ):
                negated = self._accept("kw", "NOT")
                self.i += 1
                low = self.unary()
                self._expect("kw", "AND", "AND in BETWEEN")
                left = self._between(left, low, self.unary(), negated)
            elif self._peek(0, "kw", "IN") or (self._peek(0, "kw", "NOT") and self._peek(1, "kw", "IN")):
                negated = self._accept("kw", "NOT")
                self.i += 1
                if not isinstance(left, Prop):
                    raise Sql92Error(f"{render(left)} is not a property; IN needs one, in {self.text!r}")
                left = In(left, self._string_list(), negated)
            else:
                return left

    def _between(self, value: Node, low: Node, high: Node, negated: bool) -> Between:
        if isinstance(low, Const) and isinstance(high, Const):
            if low.value is None or high.value is None:
                raise Sql92Error(f"illegal values of BETWEEN (NULL) in {self.text!r}")
            try:
                wrong = java_compare(high.value, low.value) < 0
            except EvaluationError as exc:
                raise Sql92Error(f"illegal values of BETWEEN: {exc} in {self.text!r}") from None
            if wrong:
                raise Sql92Error(
                    f"illegal values of BETWEEN: {render(low)} must be <= {render(high)} in {self.text!r}"
                )
        return Between(value, low, high, negated)

    def _string_list(self) -> tuple[str, ...]:
        self._expect("op", "(", "'(' after IN")
        values = [self._string()]
        while self._accept("op", ","):
            values.append(self._string())
        self._expect("op", ")", "')' closing IN")
        return tuple(values)

    def _string(self) -> str:
        t = self.tok
        if t.kind != "str":
            raise self._fail("expected a string literal")
        self.i += 1
        return t.text[1:-1].replace("''", "'")

    def unary(self) -> Node:
        if self._accept("op", "+"):
            return self.unary()  # Java drops a unary plus
        if self._accept("op", "-"):
            return Unary("-", self.unary())
        if self._accept("kw", "NOT"):
            return Unary("NOT", self._boolean(self.unary()))
        return self.primary()

    def primary(self) -> Node:
        t = self.tok
        self.i += 1
        if t.kind == "str":
            return Const(t.text[1:-1].replace("''", "'"))
        if t.kind == "dec":
            return Const(decimal(t.text))
        if t.kind == "float":
            return Const(floating(t.text))
        if t.kind == "kw" and t.text in ("TRUE", "FALSE", "NULL"):
            return Const({"TRUE": True, "FALSE": False, "NULL": None}[t.text])
        if t.kind == "id":
            return Prop(t.text)
        if t.kind == "op" and t.text == "(":
            node = self.or_()
            self._expect("op", ")", "')'")
            return node
        self.i -= 1
        raise self._fail("expected a value, a property or '('")


def parse(text: str) -> Node:
    """The tree of a selector expression; :class:`Sql92Error` if it is not valid 4.9.8 SQL92."""
    if not text or not text.strip():
        raise Sql92Error("an SQL92 expression must not be empty")
    return _Parser(text).parse()


# -- rendering (the inverse of parse, used by tests and logs) ---------------------------------------------


def _literal(value: Value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if value.kind == "double":
        return repr(float(value.value))
    return f"{value.value}L" if value.kind == "long" else str(value.value)


def render(node: Node) -> str:
    """SQL text that parses back to ``node`` (fully parenthesised)."""
    if isinstance(node, Const):
        return _literal(node.value)
    if isinstance(node, Prop):
        return node.name
    if isinstance(node, Unary):
        sep = " " if node.op == "NOT" else ""
        return f"({node.op}{sep}{render(node.operand)})"
    if isinstance(node, Logic | Compare):
        return f"({render(node.left)} {node.op} {render(node.right)})"
    if isinstance(node, Between):
        neg = "NOT " if node.negated else ""
        return f"({render(node.value)} {neg}BETWEEN {render(node.low)} AND {render(node.high)})"
    if isinstance(node, In):
        neg = "NOT " if node.negated else ""
        return f"({node.prop.name} {neg}IN ({', '.join(_literal(v) for v in node.values)}))"
    neg = "NOT " if node.negated else ""
    return f"({render(node.operand)} IS {neg}NULL)"
