"""The offset-half keys are settings: parsed, validated with every problem named, no longer in
the accepted-and-ignored list."""

from __future__ import annotations

import pytest

from shallowmirror.errors import ConfigError
from shallowmirror.mirror.config import MM2_IGNORED_KEYS, resolve_mm2
from shallowmirror.replication.checkpoints import checkpoints_topic, group_filter
from shallowmirror.replication.settings import OFFSET_KEYS
from shallowmirror.replication.translate import offset_syncs_cluster, offset_syncs_topic

BASE = {"clusters": "A, B", "A.bootstrap.servers": "a:9092", "B.bootstrap.servers": "b:9092",
        "A->B.enabled": "true"}


def test_offset_keys_are_settings_not_ignored_keys() -> None:
    assert not OFFSET_KEYS & MM2_IGNORED_KEYS


def test_flow_settings_resolve_with_mm2_precedence() -> None:
    flow = resolve_mm2({**BASE, "groups": "bill.*", "A->B.groups.exclude": "bill-test",
                        "offset-syncs.topic.location": "target",
                        "replication.policy.separator": "_"}).flows[0]
    assert group_filter(flow).wanted("billing") and not group_filter(flow).wanted("bill-test")
    assert offset_syncs_cluster(flow)[1] == "B"
    assert offset_syncs_topic(flow) == "mm2-offset-syncs_B_internal"
    assert checkpoints_topic(flow) == "A_checkpoints_internal"
    legacy = resolve_mm2({**BASE, "replication.policy.separator": "_",
                          "replication.policy.internal.topic.separator.enabled": "false"})
    assert checkpoints_topic(legacy.flows[0]) == "A.checkpoints.internal"


def test_bad_values_are_all_reported() -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_mm2({**BASE, "offset-syncs.topic.location": "middle", "groups": "(",
                     "emit.checkpoints.interval.seconds": "0"})
    text = str(caught.value)
    for word in ("offset-syncs.topic.location", "groups", "emit.checkpoints.interval.seconds"):
        assert word in text
