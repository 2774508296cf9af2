"""Compatibility path: the definitions live in :mod:`broker_sim.common.constants`
(the ``common`` floor that broker and client both build on); this module re-exports them for code written
against the old path."""

from __future__ import annotations

from broker_sim.common.constants import (
    AUTO_CREATE_TOPIC_KEY_TOPIC as AUTO_CREATE_TOPIC_KEY_TOPIC,
)
from broker_sim.common.constants import (
    DEFAULT_DELAY_LEVELS as DEFAULT_DELAY_LEVELS,
)
from broker_sim.common.constants import (
    DEFAULT_MAX_RECONSUME_TIMES as DEFAULT_MAX_RECONSUME_TIMES,
)
from broker_sim.common.constants import (
    DLQ_GROUP_TOPIC_PREFIX as DLQ_GROUP_TOPIC_PREFIX,
)
from broker_sim.common.constants import (
    RETRY_GROUP_TOPIC_PREFIX as RETRY_GROUP_TOPIC_PREFIX,
)
from broker_sim.common.constants import (
    SCHEDULE_TOPIC as SCHEDULE_TOPIC,
)
from broker_sim.common.constants import (
    SYSTEM_TOPICS as SYSTEM_TOPICS,
)
from broker_sim.common.constants import (
    TRANS_HALF_TOPIC as TRANS_HALF_TOPIC,
)
from broker_sim.common.constants import (
    TRANS_OP_HALF_TOPIC as TRANS_OP_HALF_TOPIC,
)
from broker_sim.common.constants import (
    SendBackDecision as SendBackDecision,
)
from broker_sim.common.constants import (
    SendBackTarget as SendBackTarget,
)
from broker_sim.common.constants import (
    clamp_level as clamp_level,
)
from broker_sim.common.constants import (
    dlq_topic as dlq_topic,
)
from broker_sim.common.constants import (
    is_retry_topic as is_retry_topic,
)
from broker_sim.common.constants import (
    parse_delay_levels as parse_delay_levels,
)
from broker_sim.common.constants import (
    parse_tag_expression as parse_tag_expression,
)
from broker_sim.common.constants import (
    retry_topic as retry_topic,
)
from broker_sim.common.constants import (
    send_back_decision as send_back_decision,
)
