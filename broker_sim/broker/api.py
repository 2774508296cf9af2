"""Compatibility path: the definitions live in :mod:`broker_sim.common.requests`
(the ``common`` floor that broker and client both build on); this module re-exports them for code written
against the old path."""

from __future__ import annotations

from broker_sim.common.channels import CheckTransactionStateRequest as CheckTransactionStateRequest
from broker_sim.common.channels import ClientChannel as ClientChannel
from broker_sim.common.requests import (
    BatchEntry as BatchEntry,
)
from broker_sim.common.requests import (
    BrokerData as BrokerData,
)
from broker_sim.common.requests import (
    ConsumeFromWhere as ConsumeFromWhere,
)
from broker_sim.common.requests import (
    ConsumerData as ConsumerData,
)
from broker_sim.common.requests import (
    ConsumerSendMsgBackRequest as ConsumerSendMsgBackRequest,
)
from broker_sim.common.requests import (
    ConsumeType as ConsumeType,
)
from broker_sim.common.requests import (
    EndTransactionRequest as EndTransactionRequest,
)
from broker_sim.common.requests import (
    ExpressionType as ExpressionType,
)
from broker_sim.common.requests import (
    HeartbeatData as HeartbeatData,
)
from broker_sim.common.requests import (
    MessageModel as MessageModel,
)
from broker_sim.common.requests import (
    MessageSelector as MessageSelector,
)
from broker_sim.common.requests import (
    Perm as Perm,
)
from broker_sim.common.requests import (
    PullMessageRequest as PullMessageRequest,
)
from broker_sim.common.requests import (
    PullMessageResponse as PullMessageResponse,
)
from broker_sim.common.requests import (
    PullStatus as PullStatus,
)
from broker_sim.common.requests import (
    QueueData as QueueData,
)
from broker_sim.common.requests import (
    QueueProgress as QueueProgress,
)
from broker_sim.common.requests import (
    ResponseCode as ResponseCode,
)
from broker_sim.common.requests import (
    SendMessageRequest as SendMessageRequest,
)
from broker_sim.common.requests import (
    SendMessageResponse as SendMessageResponse,
)
from broker_sim.common.requests import (
    SubscriptionData as SubscriptionData,
)
from broker_sim.common.requests import (
    TopicRouteData as TopicRouteData,
)
from broker_sim.common.requests import (
    TransactionType as TransactionType,
)
