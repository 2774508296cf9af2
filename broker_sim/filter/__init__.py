"""Message filters beyond tags: RocketMQ 4.9.8's SQL92 subset over message properties (``filter`` module).

``compile_sql92(text)`` parses an expression (:mod:`.sql92`, raising :class:`Sql92Error` with the position of
the problem) into a tree whose ``matches(properties)`` applies Java's evaluation rules (:mod:`.evaluate`).
"""

from __future__ import annotations

from broker_sim.filter.evaluate import Sql92Filter, compile_sql92
from broker_sim.filter.sql92 import Sql92Error, parse, render

__all__ = ["Sql92Error", "Sql92Filter", "compile_sql92", "parse", "render"]
