"""Source partitions whose topic went away under the mirror: deleted, or deleted and created
again under the same name (a new topic id, Metadata v10+).

Why it matters for commits: Kafka drops a deleted topic's committed offsets with it, so the
next topic of that name is read from ``auto.offset.reset``; a position of the old topic
committed *after* the deletion (a revocation's final commit, the commit at shutdown) is taken as
the new topic's, and its records below it are skipped. Asked of the source cluster at the
moment of the commit, not from what the fetch loop last saw, since the group may revoke before
the fetch loop notices.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from kafka.errors import UnknownTopicOrPartitionError

from shallowmirror.engine.batch import TP, SourcePartition
from shallowmirror.net import Cluster

log = logging.getLogger(__name__)

#: A deleted topic's Metadata answer.
_UNKNOWN_TOPIC_OR_PARTITION = UnknownTopicOrPartitionError.errno


async def replaced_partitions(cluster: Cluster, owned: Sequence[SourcePartition], *,
                              timeout_s: float) -> set[TP]:
    """Those of ``owned`` whose topic was deleted, or deleted and created again (a new topic
    id), since they were fetched, asked of the source cluster now. Their positions must not be
    committed: Kafka drops a deleted topic's committed offsets, and the old position committed
    afterwards went to the topic created next under that name, whose records below it were
    then skipped (Kafka 3.7: a group revoked a deleted topic's partition, committed offset
    100, and the re-created topic's first 100 records were never mirrored). No answer within
    ``timeout_s``: none (committed as before)."""
    topics = sorted({sp.topic for sp in owned})
    try:
        await asyncio.wait_for(cluster.refresh_metadata(topics), timeout_s)
    except Exception as err:  # noqa: BLE001 - the caller commits as before
        log.debug("cluster %s: topics %s not looked up: %s", cluster.alias, topics, err)
        return set()
    replaced: set[TP] = set()
    for sp in owned:
        meta = cluster.metadata.topics.get(sp.topic)
        deleted = meta is not None and meta.error_code == _UNKNOWN_TOPIC_OR_PARTITION
        now = cluster.topic_id(sp.topic)
        if deleted or (sp.topic_id is not None and now is not None and now != sp.topic_id):
            replaced.add(sp.tp)
    return replaced
