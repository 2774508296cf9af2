"""The one rule for names the producer stages under and the guard consumes as: topics and consumer groups.

Every broker adapter, table column and Redis key carries them: letters, digits, ``.``, ``_``, ``-``, and the
``%`` and ``|`` of RocketMQ's system topics (``%RETRY%billing``). Not ``:``: the lease and ``done`` keys join
prefix, group and message id with ``:`` (:data:`reliable.constants.LEASE_KEY_FORMAT`), so a group
``billing:eu`` consuming message ``o-1`` would share group ``billing``'s key for message ``eu:o-1`` — and
answer that message from the other group's ``done`` marker, its handler never run.
"""

from __future__ import annotations

import re

from reliable import constants as C
from reliable.errors import ConfigurationError

NAME_RE = re.compile(r"^[%|a-zA-Z0-9._-]+$")
NAME_CHARS = "letters, digits, '.', '_', '-', '%' and '|'"


def is_name(value: object, limit: int) -> bool:
    """``value`` is a non-empty string of at most ``limit`` name characters."""
    return isinstance(value, str) and 0 < len(value) <= limit and NAME_RE.match(value) is not None


def check_group(group: object) -> str:
    """The guard's consumer group, or :class:`ConfigurationError` naming the rule."""
    if not is_name(group, C.GROUP_MAX):
        raise ConfigurationError(
            f"consumer group {group!r}: 1..{C.GROUP_MAX} characters, only {NAME_CHARS} (the producer's rule; "
            "':' would let two groups share Redis keys)"
        )
    assert isinstance(group, str)
    return group


def text_fault(what: str, value: str) -> str | None:
    """Why no database column can hold ``value`` as it is (``None``: it can): PostgreSQL refuses a NUL in a
    text — or, through a prepared statement, cuts the text there —, and no driver can encode a lone
    surrogate."""
    if "\x00" in value:
        return f"{what} contains a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return f"{what} is not valid Unicode (a lone surrogate)"
    return None
