"""Compatibility path: the definitions live in :mod:`broker_sim.common.message`
(the ``common`` floor that broker and client both build on); this module re-exports them for code written
against the old path."""

from __future__ import annotations

from broker_sim.common.message import (
    ConsumeOrderlyStatus as ConsumeOrderlyStatus,
)
from broker_sim.common.message import (
    ConsumeStatus as ConsumeStatus,
)
from broker_sim.common.message import (
    LocalTransactionState as LocalTransactionState,
)
from broker_sim.common.message import (
    Message as Message,
)
from broker_sim.common.message import (
    MessageExt as MessageExt,
)
from broker_sim.common.message import (
    MessageQueue as MessageQueue,
)
from broker_sim.common.message import (
    Prop as Prop,
)
from broker_sim.common.message import (
    SendResult as SendResult,
)
from broker_sim.common.message import (
    SendStatus as SendStatus,
)
from broker_sim.common.message import (
    SysFlag as SysFlag,
)
from broker_sim.common.message import (
    TransactionSendResult as TransactionSendResult,
)
from broker_sim.common.message import (
    decode_offset_msg_id as decode_offset_msg_id,
)
from broker_sim.common.message import (
    encode_offset_msg_id as encode_offset_msg_id,
)
from broker_sim.common.message import (
    new_uniq_key as new_uniq_key,
)
from broker_sim.common.message import (
    properties_to_string as properties_to_string,
)
from broker_sim.common.message import (
    string_to_properties as string_to_properties,
)
