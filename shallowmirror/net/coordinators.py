"""FindCoordinator answers (group and transaction coordinators), cached per key: the exactly-once
sinks ask the target's, the consumer-protocol membership the source's."""

from __future__ import annotations

import contextlib

from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest

from shallowmirror.errors import BrokerError, ConnectionFailedError, Where
from shallowmirror.net.cluster import Cluster
from shallowmirror.net.protocol import versions

GROUP_KEY, TRANSACTION_KEY = 0, 1          # FindCoordinator key types


class Coordinators:
    """FindCoordinator results of one cluster (transaction and group coordinators), cached per
    key and forgotten when a coordinator answers that it moved."""

    def __init__(self, cluster: Cluster, alias: str) -> None:
        self.cluster = cluster
        self.alias = alias
        self._nodes: dict[tuple[int, str], int] = {}

    def forget(self, key_type: int, key: str) -> None:
        self._nodes.pop((key_type, key), None)

    async def node(self, key_type: int, key: str) -> int:
        """The coordinator's node id (raises BrokerError for an answer with an error)."""
        cached = self._nodes.get((key_type, key))
        if cached is not None:
            return cached
        conn = await self.cluster.any_connection()
        version = conn.api_version(FindCoordinatorRequest.API_KEY,
                                   versions(FindCoordinatorRequest.API_KEY))
        resp = await conn.request(FindCoordinatorRequest(key=key, key_type=key_type,
                                                         version=version))
        if resp.error_code:
            raise BrokerError(resp.error_code, Where(cluster=self.alias),
                              f"in FindCoordinator for {key!r}")
        if resp.node_id not in self.cluster.brokers:
            with contextlib.suppress(ConnectionFailedError):
                await self.cluster.refresh_metadata([])
        self._nodes[(key_type, key)] = resp.node_id
        return resp.node_id
