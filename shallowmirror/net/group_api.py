"""The consumer group protocol of KIP-848 (ConsumerGroupHeartbeat, API 68), described once from
Apache Kafka's own schema as kafka-python describes the APIs it knows (kafka-python 3.0 has
none for this one).

The broker runs the assignor: the first heartbeat of a member (epoch 0, with its subscription)
is answered with partitions, with no JoinGroup/SyncGroup round and no
``group.initial.rebalance.delay.ms``. Served by Kafka 4.0+ by default and by Kafka 3.7 with
``group.coordinator.rebalance.protocols=classic,consumer`` (early access).
"""

from __future__ import annotations

from kafka.protocol.api_message import ApiMessage

from shallowmirror.net import schemas


class ConsumerGroupHeartbeatRequest(ApiMessage, load_json=schemas):
    pass


class ConsumerGroupHeartbeatResponse(ApiMessage, load_json=schemas):
    pass


CONSUMER_GROUP_HEARTBEAT_KEY = ConsumerGroupHeartbeatRequest.API_KEY
#: Member epochs with a meaning of their own (MemberEpoch of the request).
JOIN_EPOCH, LEAVE_EPOCH, STATIC_LEAVE_EPOCH = 0, -1, -2
