"""Connections to Kafka brokers: one pipelined asyncio connection per broker, one ``Cluster`` per
cluster (bootstrap, metadata cache, leader routing, reconnect with backoff).

The hot path (Fetch, Produce) goes through ``BrokerConnection.request_frame`` / ``send_raw`` as raw
frames for the codec; every other request uses kafka-python's protocol classes via ``request``.
"""

from shallowmirror.net.cluster import (
    BrokerMetadata,
    Cluster,
    Metadata,
    PartitionMetadata,
    TopicMetadata,
)
from shallowmirror.net.config import CONNECTION_SETTINGS, ClientSettings, client_settings
from shallowmirror.net.connection import (
    AuthenticationFailedError,
    BrokerConnection,
    RequestTimedOutError,
    UnsupportedVersionError,
)

__all__ = [
    "CONNECTION_SETTINGS",
    "AuthenticationFailedError",
    "BrokerConnection",
    "BrokerMetadata",
    "ClientSettings",
    "Cluster",
    "Metadata",
    "PartitionMetadata",
    "RequestTimedOutError",
    "TopicMetadata",
    "UnsupportedVersionError",
    "client_settings",
]
