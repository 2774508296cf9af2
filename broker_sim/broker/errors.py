"""Compatibility path: the definitions live in :mod:`broker_sim.common.errors`
(the ``common`` floor that broker and client both build on); this module re-exports them for code written
against the old path."""

from __future__ import annotations

from broker_sim.common.errors import (
    BrokerConfigError as BrokerConfigError,
)
from broker_sim.common.errors import (
    BrokerError as BrokerError,
)
from broker_sim.common.errors import (
    BrokerResponseError as BrokerResponseError,
)
from broker_sim.common.errors import (
    FlushDiskTimeoutError as FlushDiskTimeoutError,
)
from broker_sim.common.errors import (
    InvalidTopicError as InvalidTopicError,
)
from broker_sim.common.errors import (
    MessageIllegalError as MessageIllegalError,
)
from broker_sim.common.errors import (
    NoPermissionError as NoPermissionError,
)
from broker_sim.common.errors import (
    ServiceNotAvailableError as ServiceNotAvailableError,
)
from broker_sim.common.errors import (
    SubscriptionGroupNotExistError as SubscriptionGroupNotExistError,
)
from broker_sim.common.errors import (
    SystemBusyError as SystemBusyError,
)
from broker_sim.common.errors import (
    TopicNotExistError as TopicNotExistError,
)
from broker_sim.common.errors import (
    error_for_code as error_for_code,
)
