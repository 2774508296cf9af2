"""Compatibility path: the definitions live in :mod:`broker_sim.common.errors`
(the ``common`` floor that broker and client both build on); this module re-exports them for code written
against the old path."""

from __future__ import annotations

from broker_sim.common.errors import (
    ClientError as ClientError,
)
from broker_sim.common.errors import (
    ClientStateError as ClientStateError,
)
from broker_sim.common.errors import (
    InvalidMessageError as InvalidMessageError,
)
from broker_sim.common.errors import (
    MQClientError as MQClientError,
)
from broker_sim.common.errors import (
    RequestTimeoutError as RequestTimeoutError,
)
from broker_sim.common.errors import (
    SendFailedError as SendFailedError,
)
from broker_sim.common.errors import (
    TransportError as TransportError,
)
