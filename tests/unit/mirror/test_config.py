"""mm2.properties / MirrorMaker 1 parsing: precedence, validation, warnings."""

import logging

import pytest

from shallowmirror.errors import ConfigError
from shallowmirror.mirror.config import (
    config_reference_markdown,
    mm1_include_regex,
    parse_properties,
    resolve_mm1,
    resolve_mm2,
)

BASE = {"clusters": "A, B", "A.bootstrap.servers": "a:9092", "B.bootstrap.servers": "b:9092",
        "A->B.enabled": "true"}


def flows(props, **kw):
    return {f.name: f for f in resolve_mm2(props, **kw).flows}


def test_properties_syntax():
    text = ("# comment\n! also comment\nclusters = A, B\nA.bootstrap.servers: a:1\n"
            "topics orders,\\\n    payments\nkey\\=with\\:escapes = v\\u0041\n  \nempty=\n")
    assert parse_properties(text) == {
        "clusters": "A, B", "A.bootstrap.servers": "a:1", "topics": "orders,payments",
        "key=with:escapes": "vA", "empty": ""}


def test_flows_are_off_unless_enabled():
    f = flows({**BASE, "B->A.enabled": "false"})
    assert list(f) == ["A->B"]


def test_precedence_flow_over_cluster_over_top_level():
    props = {**BASE, "B->A.enabled": "true",
             "topics": "top", "A->B.topics": "flow",
             "security.protocol": "PLAINTEXT", "A.security.protocol": "SSL",
             "consumer.fetch.min.bytes": "10", "A.consumer.fetch.min.bytes": "20",
             "A->B.consumer.fetch.min.bytes": "30",
             "session.timeout.ms": "7000", "A.consumer.session.timeout.ms": "8000",
             "B.producer.acks": "1", "B.producer.enable.idempotence": "false"}
    f = flows(props)
    ab, ba = f["A->B"], f["B->A"]
    assert ab.settings["topics"] == ["flow"] and ba.settings["topics"] == ["top"]
    assert ab.source_consumer["security.protocol"] == "SSL"
    assert ab.target_producer["security.protocol"] == "PLAINTEXT"
    assert ab.engine_settings["fetch.min.bytes"] == "30"        # flow consumer key
    assert ba.engine_settings["fetch.min.bytes"] == "10"        # top-level consumer key (B)
    assert ab.engine_settings["session.timeout.ms"] == "8000"   # cluster consumer key
    assert ba.engine_settings["session.timeout.ms"] == "7000"   # top-level key
    assert ab.engine_settings["acks"] == "1" and "acks" not in ba.engine_settings
    props["A->B.session.timeout.ms"] = "9000"                   # flow key beats all
    assert flows(props)["A->B"].engine_settings["session.timeout.ms"] == "9000"


def test_policy_separator_and_identity():
    f = flows({**BASE, "replication.policy.separator": "_"})["A->B"]
    assert f.remote_topic("orders") == "A_orders"
    f = flows({**BASE, "replication.policy.class":
               "org.apache.kafka.connect.mirror.IdentityReplicationPolicy"})["A->B"]
    assert f.remote_topic("orders") == "orders"


def test_blacklist_is_an_alias_of_exclude():
    f = flows({**BASE, "topics.blacklist": "secret.*"})["A->B"]
    assert not f.should_replicate("secret-1") and f.should_replicate("orders")


def test_deep_flag_overrides_use_raw_bytes():
    assert flows(BASE)["A->B"].shallow
    assert not flows(BASE, deep=True)["A->B"].shallow
    assert not flows({**BASE, "A->B.use.raw.bytes": "false"})["A->B"].shallow


def test_default_group_id_names_the_flow():
    assert flows(BASE)["A->B"].engine_settings["group.id"] == "shallowmirror-A-B"


@pytest.mark.parametrize("props,message", [
    ({"clusters": "A, B", "A.bootstrap.servers": "a:1", "A->B.enabled": "true"},
     "cluster 'B' has no bootstrap servers: set B.bootstrap.servers"),
    ({**BASE, "A->C.enabled": "true"}, "A->C: unknown cluster alias 'C'"),
    ({**BASE, "topics": "ord[ers"}, "topics (A->B): bad regex 'ord[ers'"),
    ({**BASE, "topics.exclude": "x", "topics.blacklist": "y"},
     "topics.exclude and topics.blacklist (its deprecated name) are both set"),
    ({**BASE, "A->B.enabled": "false"}, "no replication flow is enabled"),
    ({"A.bootstrap.servers": "a:1"}, "clusters: required"),
    ({**BASE, "replication.policy.class": "com.example.Mine"}, "unknown class"),
    ({**BASE, "refresh.topics.interval.seconds": "soon"}, "refresh.topics.interval.seconds"),
    ({**BASE, "A->A.enabled": "true"}, "A->A: a flow needs two different clusters"),
])
def test_bad_configuration_is_named(props, message):
    with pytest.raises(ConfigError) as info:
        resolve_mm2(props)
    assert message in str(info.value)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        resolve_mm2({"clusters": "A, B", "A->B.enabled": "true", "topics": "(",
                     "A->C.enabled": "true"})
    text = str(info.value)
    assert "A->C: unknown cluster alias 'C'" in text
    assert "set A.bootstrap.servers" in text and "set B.bootstrap.servers" in text
    assert "bad regex" in text


def test_the_process_keys_and_the_engine_keys_are_checked_in_one_run():
    """A bad process key (tasks.max) hid every bad engine key until it was fixed: two runs to
    find two typos."""
    with pytest.raises(ConfigError) as info:
        resolve_mm2({**BASE, "tasks.max": "abc", "isolation.level": "readcommitted"})
    assert info.value.problems == [
        "tasks.max (A->B): expected a whole number, got 'abc'",
        "isolation.level (A->B): must be one of read_uncommitted, read_committed, got "
        "'readcommitted'"]


def test_unknown_key_warns_with_closest_known_key(caplog):
    keys = {**BASE, "topicz": "x", "A->B.refresh.topic.enabled": "false",
            "C.bootstrap.servers": "c:1", "A.topics": "orders"}
    with pytest.raises(ConfigError) as info:
        resolve_mm2(keys)
    assert "unknown configuration key 'topicz'; did you mean 'topics'?" in str(info.value)
    assert "--allow-unknown-keys turns these into warnings" in str(info.value)
    # A flow setting at a cluster's scope would be ignored: `topics` stayed `.*`.
    assert "A.topics: topics is a flow setting, not a cluster one" in str(info.value)
    with caplog.at_level(logging.WARNING):
        cfg = resolve_mm2(keys, allow_unknown_keys=True)
    text = "\n".join(cfg.warnings)
    assert "unknown configuration key 'topicz'; did you mean 'topics'?" in text
    assert "did you mean 'A->B.refresh.topics.enabled'?" in text
    assert "cluster alias 'C' is not listed in clusters" in text
    assert "A.topics: topics is a flow setting, not a cluster one" in text
    assert "did you mean 'topics'" in caplog.text


def test_a_misspelt_cluster_or_role_key_is_unknown():
    """Cluster- and role-scoped keys are checked too: ``A.topic`` (for ``topics``) mirrored every
    topic without a word before."""
    keys = {**BASE, "A.topic": "orders", "A.isolation.levle": "read_committed",
            "A.consumer.fetch.max.bytez": "5", "B.group.idd": "g",
            "A->B.consumer.isolation.levle": "read_committed", "A.zzzz": "1"}
    with pytest.raises(ConfigError) as info:
        resolve_mm2(keys)
    problems = info.value.problems
    assert ("unknown configuration key 'A.topic'; did you mean 'topics'? (a flow setting: set "
            "it at the top level or as SOURCE->TARGET.topics)") in problems
    assert "unknown configuration key 'A.isolation.levle'; did you mean 'A.isolation.level'?" \
        in problems
    assert ("unknown configuration key 'A.consumer.fetch.max.bytez': not a Kafka consumer "
            "setting; did you mean 'A.consumer.fetch.max.bytes'?") in problems
    assert "unknown configuration key 'B.group.idd'; did you mean 'B.group.id'?" in problems
    assert ("unknown configuration key 'A->B.consumer.isolation.levle': not a Kafka consumer "
            "setting; did you mean 'A->B.consumer.isolation.level'?") in problems
    assert "unknown configuration key 'A.zzzz'" in problems
    cfg = resolve_mm2(keys, allow_unknown_keys=True)
    assert len([w for w in cfg.warnings if w.startswith("unknown configuration key")]) == 6


def test_java_client_and_connection_keys_are_known_at_every_scope():
    """What MirrorMaker 2 users carry over from Java clients is accepted (shallowmirror ignores
    what it does not use, as the Java clients do), and so are shallowmirror's own keys."""
    cfg = resolve_mm2({**BASE, "A.ssl.truststore.type": "PEM", "A.client.rack": "r1",
                       "A.consumer.max.poll.records": "5", "B.producer.linger.ms": "5",
                       "B.admin.retries": "3", "A->B.consumer.check.crcs": "true",
                       "A.reconnect.deadline.ms": "6000", "B.receive.message.max.bytes": "1000000",
                       "A.consumer.partition.assignment": "all", "A.consumer.isolation.level":
                       "read_committed", "B.producer.enable.idempotence": "true"})
    assert cfg.warnings == []


def test_mm1_unknown_keys_name_their_file():
    consumer = {"bootstrap.servers": "a:1", "group.id": "g", "isolation.levle": "x"}
    producer = {"bootstrap.servers": "b:1", "lingr.ms": "5"}
    with pytest.raises(ConfigError) as info:
        resolve_mm1(consumer, producer, include="a", consumer_config_path="c.properties",
                    producer_config_path="p.properties")
    assert info.value.problems[:2] == [
        "c.properties: unknown key 'isolation.levle': not a Kafka consumer setting; did you "
        "mean 'isolation.level'?",
        "p.properties: unknown key 'lingr.ms': not a Kafka producer setting; did you mean "
        "'linger.ms'?"]
    cfg = resolve_mm1(consumer, producer, include="a", allow_unknown_keys=True)
    (flow,) = cfg.flows
    assert "isolation.levle" not in flow.source_consumer    # warned about once, not passed on
    assert not [w for w in cfg.warnings if "source.consumer.isolation.levle" in w]


@pytest.mark.parametrize("age, refresh", [("50", 0.1), ("1000", 1.0), (None, 300.0)])
def test_mm1_topic_refresh_follows_the_consumers_metadata_age(age, refresh):
    consumer = {"bootstrap.servers": "a:1", "group.id": "g"}
    if age is not None:
        consumer["metadata.max.age.ms"] = age
    if age == "50":        # a valid consumer value the engine's metadata refresh refuses
        with pytest.raises(ConfigError, match="--consumer.config: metadata.max.age.ms: must be at least 100"):
            resolve_mm1(consumer, {"bootstrap.servers": "b:1"}, include="a")
        return
    (flow,) = resolve_mm1(consumer, {"bootstrap.servers": "b:1"}, include="a").flows
    assert flow.settings["refresh.topics.interval.seconds"] == refresh


@pytest.mark.parametrize("age", ["abc", "1.5", "nan", "-1"])
def test_mm1_a_bad_metadata_age_is_a_config_error_naming_the_file(age):
    with pytest.raises(ConfigError) as info:
        resolve_mm1({"bootstrap.servers": "a:1", "metadata.max.age.ms": age},
                    {"bootstrap.servers": "b:1"}, include="a",
                    consumer_config_path="c.properties")
    assert any(p.startswith("c.properties: metadata.max.age.ms") for p in info.value.problems)


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf"])
def test_a_float_setting_must_be_finite(value):
    """nan passed every minimum check (its comparisons are all false): an interval of nan
    seconds busy-looped the topic refresh."""
    with pytest.raises(ConfigError, match="expected a finite number"):
        resolve_mm2({**BASE, "refresh.topics.interval.seconds": value})


def test_one_cluster_as_source_and_target_with_kept_names_is_refused():
    """The mirror would read its own copies and copy them again: 1,000 records became 42,000
    in 15 s before this was refused."""
    same = {"bootstrap.servers": "Kafka-1:9092, kafka-2:9092", "group.id": "g"}
    other = {"bootstrap.servers": "kafka-2:9092"}
    for producer, shared in ((same, "kafka-1:9092, kafka-2:9092"), (other, "kafka-2:9092")):
        with pytest.raises(ConfigError) as info:   # one shared address is enough
            resolve_mm1(same, producer, include="orders")
        assert info.value.problems[0].startswith(
            f"source->target: source and target are the same cluster ({shared}) and ")
    with pytest.raises(ConfigError, match="A->B: A and B are the same cluster"):
        resolve_mm2({**BASE, "B.bootstrap.servers": "A:9092, a:9092",
                     "A.bootstrap.servers": "a:9092",
                     "replication.policy.class": "IdentityReplicationPolicy"})
    # Renamed copies (A.orders) are a cycle MirrorMaker 2's policy sees, and another cluster
    # is fine with any policy.
    resolve_mm2({**BASE, "B.bootstrap.servers": "a:9092", "A.bootstrap.servers": "a:9092"})
    resolve_mm1(same, {"bootstrap.servers": "kafka-3:9092"}, include="orders")


def test_a_flow_opts_out_of_mm2s_process_wide_exactly_once():
    """`exactly.once.source.support = enabled` with `B->A.exactly.once = false` ran B->A
    exactly-once anyway."""
    from shallowmirror.engine.config import exactly_once, resolve_settings

    for no in ("false", "no", "0", "OFF"):     # every spelling the bool setting takes
        cfg = resolve_mm2({**BASE, "B->A.enabled": "true",
                           "exactly.once.source.support": "enabled", "B->A.exactly.once": no})
        on = {f.name: exactly_once(resolve_settings(f.engine_settings)) for f in cfg.flows}
        assert on == {"A->B": True, "B->A": False}, no


def test_known_mm2_keys_are_not_warned_about():
    cfg = resolve_mm2({**BASE, "emit.heartbeats.enabled": "false", "groups": ".*",
                       "offset.storage.replication.factor": "1",
                       "A->B.emit.checkpoints.enabled": "false"})
    assert cfg.warnings == []


def test_identity_bidirectional_warns_about_loops():
    cfg = resolve_mm2({**BASE, "B->A.enabled": "true",
                       "replication.policy.class": "IdentityReplicationPolicy"})
    assert any("cannot detect cycles" in w for w in cfg.warnings)


def test_only_targets():
    cfg = resolve_mm2({**BASE, "B->A.enabled": "true"})
    assert [f.name for f in cfg.only_targets(["A"]).flows] == ["B->A"]
    with pytest.raises(ConfigError, match="unknown cluster alias 'Z'"):
        cfg.only_targets(["Z"])


def test_mm1_flags_become_one_identity_flow():
    cfg = resolve_mm1({"bootstrap.servers": "a:1", "group.id": "mm1",
                       "key.deserializer": "org.apache.kafka.x"},
                      {"bootstrap.servers": "b:1", "acks": "all"},
                      include="orders, payments", num_streams=2,
                      offset_commit_interval_ms=1000)
    (flow,) = cfg.flows
    assert flow.remote_topic("orders") == "orders"
    assert flow.should_replicate("payments") and not flow.should_replicate("users")
    assert flow.engine_settings["group.id"] == "mm1"
    assert flow.engine_settings["offset.commit.interval.ms"] == "1000"
    assert flow.settings["tasks.max"] == 2
    assert flow.settings["abort.on.send.failure"] is True
    assert not flow.settings["sync.topic.configs.enabled"]
    # Nothing is written to the source cluster, which MirrorMaker 1 only read.
    assert flow.settings["offset-syncs.topic.location"] == "target"
    assert not flow.settings["emit.heartbeats.enabled"]
    assert mm1_include_regex("'a, b.*'") == "a|b.*"


def test_mm1_errors():
    with pytest.raises(ConfigError) as info:
        resolve_mm1({}, {"bootstrap.servers": "b:1"}, include="a", whitelist="b",
                    num_streams=0)
    text = str(info.value)
    assert "--include and --whitelist" in text
    assert "--num.streams must be at least 1" in text
    assert "--consumer.config: bootstrap.servers is required" in text


def test_reference_markdown_lists_mirror_and_engine_keys():
    text = config_reference_markdown()
    assert "| `topics.exclude` |" in text and "| `fetch.max.bytes` |" in text


def test_librdkafka_configs_drop_java_only_keys():
    from shallowmirror.mirror.clients import build_client

    def without_logging(config: dict) -> dict:
        # Every client also gets librdkafka's logs routed through Python logging.
        assert {"logger", "log_level"} <= set(config)
        return {k: v for k, v in config.items() if k not in ("logger", "log_level")}

    built = build_client(dict, {"bootstrap.servers": "a:1", "key.deserializer": "x.Y",
                                "partition.assignment.strategy": "roundrobin",
                                "reconnect.deadline.ms": "5000"}, what="t")
    connection = {"bootstrap.servers": "a:1", "client.id": "shallowmirror",
                  "security.protocol": "PLAINTEXT"}      # net.config.librdkafka_connection
    assert without_logging(built) == {**connection,
                                      "partition.assignment.strategy": "roundrobin"}
    built = build_client(dict, {"bootstrap.servers": "a:1", "partition.assignment.strategy":
                                "org.apache.kafka.clients.consumer.RangeAssignor"}, what="t")
    assert without_logging(built) == connection


@pytest.mark.parametrize("key", ["security.protocol", "sasl.mechanism", "reconnect.deadline.ms",
                                 "socket.connection.setup.timeout.ms"])
def test_a_flow_scoped_client_key_is_said_to_reach_no_client(key):
    """``A->B.security.protocol`` configures no client, here as in MirrorMaker 2 (a flow's
    clients take ``A->B.consumer.`` / ``A->B.producer.`` keys): said once, with the keys that
    would, and no client gets it."""
    cfg = resolve_mm2({**BASE, f"A->B.{key}": "SASL_SSL"})
    said = [w for w in cfg.warnings if w.startswith(f"A->B.{key} ")]
    assert said == [f"A->B.{key} applies to no client (as in MirrorMaker 2): set A.{key} and "
                    f"B.{key} for every client of those clusters, or A->B.consumer.{key} / "
                    f"A->B.producer.{key} for this flow's"]
    flow = cfg.flows[0]
    assert key not in flow.source_consumer and key not in flow.target_producer


def test_a_flow_scoped_setting_that_is_also_a_client_key_is_applied_without_a_warning():
    cfg = resolve_mm2({**BASE, "A->B.request.timeout.ms": "7000"})
    assert not [w for w in cfg.warnings if "request.timeout.ms" in w]
    assert cfg.flows[0].engine_settings["request.timeout.ms"] == "7000"


def test_mm1_mirrors_only_what_include_names_not_heartbeats_topics():
    """MirrorMaker 2 copies every ``heartbeats`` topic whatever ``topics`` says; MirrorMaker 1
    only what --include names (a legacy run copied heartbeats topics, renamed, and said caught
    up with an --include that matched nothing)."""
    (flow,) = resolve_mm1({"bootstrap.servers": "a:1", "group.id": "g"},
                          {"bootstrap.servers": "b:1"}, include="orders").flows
    assert flow.settings["heartbeats.replication.enabled"] is False


@pytest.mark.parametrize("include", [" ", "''", ",", " , "])
def test_mm1_include_that_names_no_topic_is_refused(include):
    with pytest.raises(ConfigError) as info:
        resolve_mm1({"bootstrap.servers": "a:1", "group.id": "g"},
                    {"bootstrap.servers": "b:1"}, include=include)
    assert info.value.problems == [
        f"--include is required (a regex of topics to mirror, e.g. '.*') (got {include!r}, "
        "which names no topic)"]


def test_mm1_empty_group_id_is_the_default_group_with_a_warning(caplog):
    (flow,) = resolve_mm1({"bootstrap.servers": "a:1", "group.id": " "},
                          {"bootstrap.servers": "b:1"}, include="orders",
                          consumer_config_path="c.properties").flows
    assert "c.properties has no group.id (it is empty); using shallowmirror-source-target" \
        in caplog.text
    assert "group.id" not in flow.source_consumer


def test_a_java_character_class_is_refused_by_name():
    """``\\p{Alnum}`` is Java's; Python's error was "bad escape \\p at position 0", shown with
    its backslash doubled."""
    with pytest.raises(ConfigError) as info:
        resolve_mm1({"bootstrap.servers": "a:1", "group.id": "g"},
                    {"bootstrap.servers": "b:1"}, include=r"\p{Alnum}+")
    assert info.value.problems[0].startswith(
        r"--include: bad regex '\p{Alnum}+': \p{Alnum} is a Java character class, which "
        r"Python's regexes lack; write the class out instead (\p{Alnum} is [A-Za-z0-9]")
    with pytest.raises(ConfigError) as info:
        resolve_mm2({**BASE, "topics": r"orders\P{Digit}"})
    assert r"bad regex 'orders\P{Digit}': \P{Digit} is a Java character class" in str(info.value)


@pytest.mark.parametrize(("consumer", "producer", "flags", "says"), [
    ({"auto.offset.reset": "sometimes"}, {}, {},
     "c.properties: auto.offset.reset: must be one of earliest, latest, got 'sometimes'"),
    ({"security.protocol": "TLS"}, {}, {}, "c.properties: security.protocol: must be one of "),
    ({}, {"acks": "2"}, {}, "p.properties: acks: must be one of all, -1, 1, got '2'"),
    ({}, {}, {"offset_commit_interval_ms": -1},
     "--offset.commit.interval.ms: must be at least 10, got -1"),
])
def test_mm1_bad_values_name_the_file_or_flag_they_came_from(consumer, producer, flags, says):
    """They were said of the MirrorMaker 2 flow made from the files: `auto.offset.reset
    (source->target): ...`, `security.protocol (cluster source): ...`."""
    with pytest.raises(ConfigError) as info:
        resolve_mm1({"bootstrap.servers": "a:1", "group.id": "g", **consumer},
                    {"bootstrap.servers": "b:1", **producer}, include="orders",
                    consumer_config_path="c.properties", producer_config_path="p.properties",
                    **flags)
    assert info.value.problems[0].startswith(says), info.value.problems
