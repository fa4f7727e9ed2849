"""MirrorMaker 2 (``mm2.properties``) and MirrorMaker 1 (``--consumer.config`` ...) configuration.

The result is a ``MirrorConfig``: the clusters and one ``FlowConfig`` per enabled flow, each with
its resolved settings and its four client configs. Everything is checked before anything runs;
every problem is reported at once (``ConfigError``); unknown keys warn with the closest known key.

MM2 precedence, decided in one place (``client_config`` for the four client configs,
``_settings_raw`` for the settings), highest first::

    settings (topics, refresh..., engine keys)      source consumer (flow A->B)
      A->B.<key>                                      A->B.consumer.<key>
      A->B.consumer.<key> / A->B.producer.<key> (*)   A.consumer.<key>
      A.consumer.<key> / B.producer.<key>       (*)   A.<key>
      consumer.<key> / producer.<key>           (*)   consumer.<key>
      <key>                                           <client key> at top level (bootstrap.servers,
      built-in default                                  security.protocol, ssl.*, sasl.*, client.id)

(*) only engine keys that are consumer keys (``group.id``, ``session.timeout.ms``, ``fetch.*`` ...)
on the source side, or producer keys (``acks``, ``max.request.size`` ...) on the target side. The
target producer and both admin clients resolve like the source consumer with ``producer.`` /
``admin.``. Flows are off unless ``A->B.enabled = true`` (as in MM2).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shallowmirror.errors import ConfigError
from shallowmirror.mirror.filters import (
    CONFIG_PROPERTIES_EXCLUDE_DEFAULT,
    TOPICS_EXCLUDE_DEFAULT,
    ConfigPropertyFilter,
    TopicFilter,
    pattern_problem,
    regex_problem,
)
from shallowmirror.mirror.policy import (
    DEFAULT_POLICY,
    POLICY_NAMES,
    DefaultReplicationPolicy,
    make_policy,
    should_replicate_topic,
)
from shallowmirror.replication.heartbeats import (
    HEARTBEAT_SETTINGS,
    HeartbeatPair,
    heartbeat_pairs,
)
from shallowmirror.replication.settings import OFFSET_SETTINGS
from shallowmirror.replication.sync_settings import (
    GROUP_SYNC_SETTINGS,
    REVERSE_CHECKPOINT_SETTINGS,
    group_sync_warnings,
    reverse_checkpointing_problems,
)
from shallowmirror.settings import Setting, SettingsTable

log = logging.getLogger(__name__)


def port_problem(value: int) -> str | None:
    """A TCP port a server can listen on: 1-65535."""
    return None if 0 < value < 65536 else f"must be a TCP port, 1-65535, got {value}"


def _policy_problem(value: str) -> str | None:
    if value.strip() in POLICY_NAMES:
        return None
    return (f"unknown class {value!r}; shallowmirror supports "
            "org.apache.kafka.connect.mirror.DefaultReplicationPolicy and "
            "org.apache.kafka.connect.mirror.IdentityReplicationPolicy")


MIRROR_SETTINGS = SettingsTable(
    title="Mirror process (mm2.properties keys)",
    settings=[
        Setting("clusters", "list", None, "Cluster aliases, comma-separated (required). Each "
                "needs `<alias>.bootstrap.servers`; `<alias>.<client key>` configures every "
                "client of that cluster, `<alias>.consumer.*`/`.producer.*`/`.admin.*` one kind.",
                scope="process"),
        Setting("enabled", "bool", False, "Set as `A->B.enabled = true` to run the flow from "
                "cluster A to cluster B (off by default, as in MirrorMaker 2).", scope="flow"),
        Setting("topics", "list", [".*"], "Topics to replicate: names and/or regexes, "
                "comma-separated, each matching the whole name.", scope="flow",
                validator=pattern_problem),
        Setting("topics.exclude", "list", list(TOPICS_EXCLUDE_DEFAULT),
                "Topics never to replicate (names and/or regexes). Internal topics (`__*`, "
                "`*.internal`, `*-internal`) are never replicated whatever this says.",
                scope="flow", validator=pattern_problem),
        Setting("topics.blacklist", "list", None, "Deprecated name of `topics.exclude`.",
                scope="flow", validator=pattern_problem),
        Setting("config.properties.exclude", "list", list(CONFIG_PROPERTIES_EXCLUDE_DEFAULT),
                "Topic config properties not copied to remote topics (names and/or regexes). "
                "`compression.type` is never copied: remote topics get `producer`, otherwise "
                "the target broker would recompress every batch.", scope="flow",
                validator=pattern_problem),
        Setting("config.properties.blacklist", "list", None,
                "Deprecated name of `config.properties.exclude`.", scope="flow",
                validator=pattern_problem),
        Setting("replication.policy.class", "str", DEFAULT_POLICY,
                "DefaultReplicationPolicy (remote topics `<source alias><separator><topic>`, "
                "cycles detected) or IdentityReplicationPolicy (names unchanged, as MirrorMaker "
                "1; cannot detect cycles).", scope="flow", validator=_policy_problem),
        Setting("replication.policy.separator", "str", ".",
                "Separator between source alias and topic in remote topic names.", scope="flow",
                validator=lambda v: None if v else "must not be empty"),
        Setting("heartbeats.replication.enabled", "bool", True,
                "Replicate `heartbeats` topics (and their remote copies) even when `topics` "
                "does not name them, as MM2 does.", scope="flow"),
        Setting("sync.topic.configs.enabled", "bool", True,
                "Copy source topic configs to remote topics at creation and whenever they "
                "change (IncrementalAlterConfigs).", scope="flow"),
        Setting("sync.topic.configs.interval.seconds", "float", 600.0,
                "How often source topic configs are compared with remote ones.", scope="flow",
                minimum=0.1),
        Setting("refresh.topics.enabled", "bool", True,
                "Look for new topics and partitions on the source periodically.", scope="flow"),
        Setting("refresh.topics.interval.seconds", "float", 600.0,
                "How often the source is checked for new topics and partitions.", scope="flow",
                minimum=0.1),
        Setting("replication.factor", "int", -1,
                "Replication factor of created remote topics; -1 takes the target broker's "
                "default (MM2's default is 2).", scope="flow", minimum=-1),
        Setting("tasks.max", "int", 1,
                "Engines run in this process for the flow; they share the flow's partitions "
                "through the source consumer group. Run more processes with the same file to "
                "scale out.", scope="flow", minimum=1),
        Setting("use.raw.bytes", "bool", True,
                "Shallow mirroring: forward compressed RecordBatches byte for byte. false "
                "decompresses and recompresses (the deep path, also `--deep`).", scope="flow"),
        Setting("abort.on.send.failure", "bool", False,
                "Stop the whole process when a flow fails (MirrorMaker 1 semantics); otherwise "
                "the flow is restarted with backoff and the others keep going.", scope="flow"),
        Setting("task.shutdown.graceful.timeout.ms", "int", 30000,
                "On SIGTERM/SIGINT, how long a flow may take to finish in-flight batches and "
                "commit before the process gives up on it (exit status 1; records copied after "
                "the last commit are found on the target on restart with "
                "resume.from.target=true, mirrored again without it).", scope="flow",
                minimum=0),
        Setting("status.interval.seconds", "float", 30.0,
                "Period of the status line (per flow: MB/s, records/s, lag); 0 turns it off.",
                scope="process", minimum=0),
        Setting("prometheus.port", "int", None,
                "Serve Prometheus metrics on this port (needs prometheus-client).",
                scope="process", validator=port_problem),
        Setting("metrics.file", "str", None,
                "Append JSON-lines metrics events (flow and process records) to this file.",
                scope="process"),
        *HEARTBEAT_SETTINGS,
        *OFFSET_SETTINGS,
        *GROUP_SYNC_SETTINGS,
        *REVERSE_CHECKPOINT_SETTINGS,
    ],
)

#: Keys MM2 knows that shallowmirror accepts without acting on them (logged once, not warned
#: about as unknown): mm2.properties files from MirrorMaker 2 keep working.
MM2_IGNORED_KEYS = frozenset({
    "group.filter.class",
    "sync.topic.acls.enabled", "sync.topic.acls.interval.seconds",
    "offset.lag.max", "admin.timeout.ms",
    "consumer.poll.timeout.ms",
    "dedicated.mode.enable.internal.rest",
    "topic.filter.class", "config.property.filter.class", "use.defaults.from",
    "key.converter", "value.converter", "header.converter", "name", "connector.class",
    "source.cluster.alias", "target.cluster.alias", "config.providers",
})
#: Connect worker settings MM2 accepts at top level; meaningless here.
MM2_IGNORED_PREFIXES = ("offset.storage.", "config.storage.", "status.storage.", "task.",
                        "worker.", "key.converter.", "value.converter.", "header.converter.",
                        "config.providers.")

#: Top-level keys that configure every client of every cluster (MM2's CLIENT_CONFIG_DEF).
CLIENT_KEY_PREFIXES = ("bootstrap.servers", "security.protocol", "ssl.", "sasl.", "client.id",
                       "client.dns.lookup", "socket.", "connections.max.idle.ms",
                       "reconnect.", "metadata.max.age.ms", "request.timeout.ms",
                       "retry.backoff.ms", "send.buffer.bytes", "receive.buffer.bytes")

#: Engine keys that are consumer settings (may come as `consumer.x`) and producer settings.
CONSUMER_ENGINE_KEYS = frozenset({
    "group.id", "session.timeout.ms", "heartbeat.interval.ms", "isolation.level",
    "auto.offset.reset", "fetch.max.bytes", "max.partition.fetch.bytes", "fetch.max.wait.ms",
    "fetch.min.bytes", "metadata.max.age.ms", "partition.assignment", "group.instance.id",
})
PRODUCER_ENGINE_KEYS = frozenset({
    "acks", "enable.idempotence", "max.in.flight.requests.per.connection", "max.request.size",
    "buffer.memory", "request.timeout.ms", "retry.backoff.ms", "retry.backoff.max.ms",
})
CLIENT_ROLES = ("consumer.", "producer.", "admin.")

ALIAS_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_\-]*$")
_FLOW_KEY_RE = re.compile(r"^(?P<source>[^\s]+?)->(?P<target>[^\s.]+)\.(?P<key>.+)$")


def _engine_table():
    """The engine's settings table, if the engine is installed (it is imported lazily so the
    configuration layer stays usable on its own)."""
    try:
        from shallowmirror.engine.config import ENGINE_SETTINGS
    except ImportError:  # pragma: no cover - the engine ships with the package
        return None
    return ENGINE_SETTINGS


def _engine_names() -> set[str]:
    table = _engine_table()
    # metrics.file is one file for the whole process: the mirror owns it, not each engine.
    return set(table.names()) - {"metrics.file"} if table is not None else set()


# ---------------------------------------------------------------------------------------------
# Properties files


def parse_properties(text: str) -> dict[str, str]:
    """Java ``.properties`` syntax: ``key=value``, ``key: value`` or ``key value``; ``#``/``!``
    comments; backslash line continuation; ``\\=``, ``\\:``, ``\\t``, ``\\n``, ``\\uXXXX``."""
    props: dict[str, str] = {}
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.lstrip() if pending else raw.strip()
        if not pending and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending += line[:-1]
            continue
        logical.append(pending + line)
        pending = ""
    if pending:
        logical.append(pending)
    for line in logical:
        key, value = _split_property(line.strip())
        props[_unescape(key)] = _unescape(value.strip())
    return props


def _split_property(line: str) -> tuple[str, str]:
    i = 0
    while i < len(line):
        ch = line[i]
        if ch == "\\":
            i += 2
            continue
        if ch in "=:" or ch.isspace():
            key, rest = line[:i], line[i:].lstrip()
            if ch.isspace() and rest[:1] in ("=", ":"):
                rest = rest[1:]
            elif not ch.isspace():
                rest = line[i + 1:]
            return key, rest.lstrip()
        i += 1
    return line, ""


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 2:i + 6]):
                out.append(chr(int(text[i + 2:i + 6], 16)))
                i += 6
                continue
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def load_properties(path: str | Path, what: str = "") -> dict[str, str]:
    """Read a properties file; a missing or unreadable file is a ``ConfigError``. ``what``
    names the file in it when there are several (``--consumer.config``)."""
    named = f"{what} {path}" if what else str(path)
    if not str(path).strip():
        raise ConfigError(f"no properties file given{f' for {what}' if what else ''} (the file "
                          "name is empty)")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read {named}: {err.strerror or err}") from err
    except UnicodeDecodeError as err:
        line = err.object[:err.start].count(b"\n") + 1
        raise ConfigError(f"{named} is not a text properties file: byte "
                          f"0x{err.object[err.start]:02x} at line {line} (byte {err.start}) is "
                          "not UTF-8") from err
    if "\x00" in text:
        raise ConfigError(f"{named} is not a text properties file: it contains NUL bytes")
    return parse_properties(text)


# ---------------------------------------------------------------------------------------------
# Resolved configuration


@dataclass
class FlowConfig:
    """One replication flow, source alias -> target alias, fully resolved."""

    source: str
    target: str
    settings: dict[str, Any]
    engine_settings: dict[str, Any]
    source_consumer: dict[str, str]
    target_producer: dict[str, str]
    source_admin: dict[str, str]
    target_admin: dict[str, str]
    policy: DefaultReplicationPolicy = field(init=False)
    topic_filter: TopicFilter = field(init=False)
    config_filter: ConfigPropertyFilter = field(init=False)
    #: The enabled flow target->source, if any (reverse checkpointing translates with it).
    opposite: FlowConfig | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        s = self.settings
        self.policy = make_policy(s["replication.policy.class"], s["replication.policy.separator"],
                                  source_alias=self.source)
        exclude = s["topics.blacklist"] if s.get("topics.blacklist") is not None \
            else s["topics.exclude"]
        self.topic_filter = TopicFilter(tuple(s["topics"]), tuple(exclude))
        props_exclude = s["config.properties.blacklist"] \
            if s.get("config.properties.blacklist") is not None \
            else s["config.properties.exclude"]
        self.config_filter = ConfigPropertyFilter(tuple(props_exclude))

    @property
    def name(self) -> str:
        return f"{self.source}->{self.target}"

    @property
    def shallow(self) -> bool:
        return bool(self.settings["use.raw.bytes"])

    def remote_topic(self, topic: str) -> str:
        return self.policy.format_remote_topic(self.source, topic)

    def should_replicate(self, topic: str) -> bool:
        return should_replicate_topic(
            self.policy, topic, self.target, self.topic_filter,
            heartbeats_replication=self.settings["heartbeats.replication.enabled"])


@dataclass
class MirrorConfig:
    """Clusters, enabled flows and process-wide settings."""

    clusters: list[str]
    flows: list[FlowConfig]
    process: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    #: Heartbeat emitters (replication/heartbeats.py), among the clusters of enabled flows.
    heartbeat_pairs: list[HeartbeatPair] = field(default_factory=list)

    def only_targets(self, targets: Iterable[str]) -> MirrorConfig:
        """Keep flows into these clusters (MM2's ``--clusters``)."""
        wanted = set(targets)
        unknown = sorted(wanted - set(self.clusters))
        if unknown:
            raise ConfigError([f"--clusters: unknown cluster alias {a!r} (clusters: "
                               f"{', '.join(self.clusters)})" for a in unknown])
        return MirrorConfig(self.clusters, [f for f in self.flows if f.target in wanted],
                            self.process, self.warnings,
                            [p for p in self.heartbeat_pairs if p.target in wanted])


def _strip(props: Mapping[str, str], prefix: str) -> dict[str, str]:
    n = len(prefix)
    return {k[n:]: v for k, v in props.items() if k.startswith(prefix) and len(k) > n}


def _is_client_key(key: str) -> bool:
    return key.startswith(CLIENT_KEY_PREFIXES)


def _non_role(props: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in props.items() if not k.startswith(CLIENT_ROLES)}


def client_config(props: Mapping[str, str], alias: str, role: str,
                  flow: str | None = None) -> dict[str, str]:
    """The config of one client (``role`` = consumer/producer/admin) of cluster ``alias``,
    MM2 precedence: flow role keys > cluster role keys > cluster keys > top-level role keys >
    top-level client keys."""
    top = {k: v for k, v in props.items() if _is_client_key(k)}
    cluster = _strip(props, f"{alias}.")
    merged: dict[str, str] = {}
    merged.update(top)
    merged.update(_strip(props, f"{role}."))
    merged.update(_non_role(cluster))
    merged.update(_strip(cluster, f"{role}."))
    if flow is not None:
        merged.update(_strip(props, f"{flow}.{role}."))
    return merged


def _split_scopes(props: Mapping[str, str], clusters: list[str]) -> tuple[
        dict[str, str], dict[str, dict[str, str]], dict[tuple[str, str], dict[str, str]]]:
    """Top-level keys, ``<alias>.*`` keys per alias, ``<a>-><b>.*`` keys per flow."""
    top: dict[str, str] = {}
    per_cluster: dict[str, dict[str, str]] = {a: {} for a in clusters}
    per_flow: dict[tuple[str, str], dict[str, str]] = {}
    by_length = sorted(clusters, key=len, reverse=True)
    for key, value in props.items():
        m = _FLOW_KEY_RE.match(key)
        if m and key.index("->") < key.find("."):
            per_flow.setdefault((m["source"], m["target"]), {})[m["key"]] = value
            continue
        alias = next((a for a in by_length if key.startswith(f"{a}.")), None)
        if alias is not None:
            per_cluster[alias][key[len(alias) + 1:]] = value
        else:
            top[key] = value
    return top, per_cluster, per_flow


def _settings_raw(top: Mapping[str, str], flow_keys: Mapping[str, str],
                  source_consumer: Mapping[str, str], target_producer: Mapping[str, str],
                  names: set[str]) -> dict[str, str]:
    """Raw values of mirror/engine settings for one flow, lowest precedence first."""
    raw: dict[str, str] = {k: v for k, v in top.items() if k in names}
    raw.update({k: v for k, v in source_consumer.items() if k in CONSUMER_ENGINE_KEYS})
    raw.update({k: v for k, v in target_producer.items() if k in PRODUCER_ENGINE_KEYS})
    raw.update({k: v for k, v in _non_role(flow_keys).items() if k in names})
    return raw


def _known_names() -> list[str]:
    return MIRROR_SETTINGS.names() + sorted(_engine_names()) + sorted(MM2_IGNORED_KEYS)


def _closest(key: str) -> str | None:
    return _closest_in(key, _known_names())


def _check_top_level_key(key: str, clusters: list[str], warnings: list[str],
                         ignored: set[str], unknown: list[str]) -> None:
    if key in MIRROR_SETTINGS or key in _engine_names() or _is_client_key(key):
        return
    if key.startswith(CLIENT_ROLES):
        return  # consumer.* / producer.* / admin.* apply to every cluster
    if key in MM2_IGNORED_KEYS or key.startswith(MM2_IGNORED_PREFIXES):
        ignored.add(key)
        return
    head = key.split(".", 1)[0]
    if key.endswith(".bootstrap.servers") and head not in clusters:
        warnings.append(f"{key}: cluster alias {head!r} is not listed in clusters "
                        f"({', '.join(clusters)}); the key is ignored")
        return
    hint = _closest(key)
    unknown.append(f"unknown configuration key {key!r}"
                   + (f"; did you mean {hint!r}?" if hint else ""))


def _role_key_hint(role: str, key: str) -> tuple[bool, str | None]:
    """(whether ``key`` is known to a ``role`` client, the closest known key if not). Known:
    that Java client's keys, the connection keys and the shallowmirror keys a role carries."""
    from shallowmirror.net.client_keys import KEYS_OF_ROLE
    from shallowmirror.net.config import CONNECTION_SETTINGS

    known = KEYS_OF_ROLE[role] | set(CONNECTION_SETTINGS.names()) | _engine_names()
    if key in known or _is_client_key(key):
        return True, None
    return False, _closest_in(key, known)


def _scoped_key_problem(scope: str, key: str) -> str | None:
    """The unknown-key problem of ``key`` under ``scope`` (``A.`` or ``A->B.``), or None when it
    is known. A role key (``consumer.x``) must be known to that role (``_role_key_hint``); a
    cluster key, any Java client's key, a connection or shallowmirror key, or one MirrorMaker
    2 keeps and shallowmirror ignores. A Java client key shallowmirror does not use is
    ignored, as MirrorMaker 2's clients ignore what they do not use."""
    from shallowmirror.net.client_keys import ANY_CLIENT_KEYS, KEYS_OF_ROLE
    from shallowmirror.net.config import CONNECTION_SETTINGS

    role, _, rest = key.partition(".")
    if role in KEYS_OF_ROLE and rest:
        known, hint = _role_key_hint(role, rest)
        if known:
            return None
        return (f"unknown configuration key '{scope}{key}': not a Kafka {role} setting"
                + (f"; did you mean '{scope}{role}.{hint}'?" if hint else ""))
    connection = set(CONNECTION_SETTINGS.names())
    if (key in ANY_CLIENT_KEYS or key in connection or key in _engine_names()
            or key in MIRROR_SETTINGS or _is_client_key(key) or key in MM2_IGNORED_KEYS
            or key.startswith(MM2_IGNORED_PREFIXES)):
        return None
    hint = _closest_in(key, ANY_CLIENT_KEYS | connection | _engine_names()
                       | set(MIRROR_SETTINGS.names()))
    if hint is None:
        return f"unknown configuration key '{scope}{key}'"
    if hint in MIRROR_SETTINGS and MIRROR_SETTINGS[hint].scope == "flow":
        return (f"unknown configuration key '{scope}{key}'; did you mean {hint!r}? (a flow "
                f"setting: set it at the top level or as SOURCE->TARGET.{hint})")
    return f"unknown configuration key '{scope}{key}'; did you mean '{scope}{hint}'?"


def _closest_in(key: str, names: Iterable[str]) -> str | None:
    import difflib

    match = difflib.get_close_matches(key, list(names), n=1, cutoff=0.6)
    return match[0] if match else None


#: Closes the list of unknown-key problems: why they are errors, and the way out.
UNKNOWN_KEYS_HINT = ("an unknown key is an error, so that a typo cannot change what is mirrored "
                     "(a misspelt `topics` would mirror every topic); --allow-unknown-keys "
                     "turns these into warnings")


def _client_problems(config: Mapping[str, str], alias: str) -> list[str]:
    """What the connection layer would refuse in one client config (bootstrap addresses,
    security.protocol, SASL, SSL files), found before anything runs."""
    from shallowmirror.net.config import client_settings

    try:
        client_settings(config, alias)
    except ConfigError as err:
        return err.problems
    return []


def _flow_opts_out_of_exactly_once(flow_keys: Mapping[str, str]) -> bool:
    """Whether the flow itself sets ``exactly.once`` false, in any spelling the setting takes
    (false, 0, no, off); a bad value is left to the engine settings' own check."""
    from shallowmirror.engine.config import ENGINE_SETTINGS

    raw = _non_role(flow_keys).get("exactly.once")
    if raw is None:
        return False
    try:
        return not ENGINE_SETTINGS["exactly.once"].parse(raw)
    except ValueError:
        return False


def _same_cluster_problem(flow: FlowConfig) -> str | None:
    """A flow whose source and target share a bootstrap address reads the cluster it writes.
    With names kept (IdentityReplicationPolicy: every MirrorMaker 1 flow) each record is
    mirrored onto itself, read again and copied again, without end: refused. (Two different
    addresses of one cluster are not caught here.)"""
    if flow.policy.detects_cycles:
        return None
    from shallowmirror.net.config import client_settings

    try:
        source = client_settings(flow.source_consumer, flow.source)
        target = client_settings(flow.target_producer, flow.target)
    except ConfigError:
        return None                     # reported as the connection problem it is
    shared = source.shared_addresses(target)
    if not shared:
        return None
    address = ", ".join(shared)
    return (f"{flow.name}: {flow.source} and {flow.target} are the same cluster ({address}) "
            f"and {flow.policy.class_name} keeps topic names, so the mirror would read its "
            "own copies and copy them again without end: point the target at another cluster")


def resolve_mm2(props: Mapping[str, str], *, deep: bool = False,
                overrides: Mapping[str, Any] | None = None,
                allow_unknown_keys: bool = False) -> MirrorConfig:
    """Turn mm2.properties into a ``MirrorConfig``, reporting every problem at once.

    ``deep`` forces ``use.raw.bytes=false`` on every flow; ``overrides`` (from CLI options)
    replace top-level keys. Unknown keys are problems unless ``allow_unknown_keys``, which
    makes them warnings."""
    props = {k.strip(): str(v) for k, v in props.items()}
    for key, value in (overrides or {}).items():
        if value is not None:
            props[key] = str(value)
    problems: list[str] = []
    warnings: list[str] = []
    unknown_keys: list[str] = []
    ignored: set[str] = set()

    clusters_raw = props.get("clusters", "")
    clusters = [c.strip() for c in clusters_raw.split(",") if c.strip()]
    if not clusters:
        problems.append("clusters: required, e.g. `clusters = A, B` with A.bootstrap.servers "
                        "and B.bootstrap.servers")
    for alias in clusters:
        if not ALIAS_RE.match(alias):
            problems.append(f"clusters: alias {alias!r} may hold only letters, digits, '_' and "
                            "'-'")
    duplicates = sorted({a for a in clusters if clusters.count(a) > 1})
    if duplicates:
        problems.append(f"clusters: alias listed twice: {', '.join(duplicates)}")

    top, per_cluster, per_flow = _split_scopes(props, clusters)
    for key in top:
        _check_top_level_key(key, clusters, warnings, ignored, unknown_keys)
    for alias, keys in per_cluster.items():
        for key in keys:
            if key in MIRROR_SETTINGS and MIRROR_SETTINGS[key].scope == "flow":
                # A problem as an unknown key is: `A.topics = orders` left `topics = .*`.
                unknown_keys.append(f"{alias}.{key}: {key} is a flow setting, not a cluster "
                                    f"one; it is ignored here: use {alias}->TARGET.{key} or "
                                    f"{key}")
            else:
                problem = _scoped_key_problem(f"{alias}.", key)
                if problem:
                    unknown_keys.append(problem)

    # Flows: every `X->Y.*` key must name known aliases; enabled flows are the ones to run.
    enabled: list[tuple[str, str]] = []
    for (source, target), keys in sorted(per_flow.items()):
        flow = f"{source}->{target}"
        unknown = [a for a in (source, target) if a not in clusters]
        for alias in unknown:
            problems.append(f"{flow}: unknown cluster alias {alias!r} (clusters: "
                            f"{', '.join(clusters) or 'none'})")
        if source == target:
            problems.append(f"{flow}: a flow needs two different clusters")
        if unknown or source == target:
            continue
        try:
            on = MIRROR_SETTINGS["enabled"].parse(keys.get("enabled", "false"))
        except ValueError as err:
            problems.append(f"{flow}.enabled: {err}")
            continue
        if on:
            enabled.append((source, target))
    if clusters and not enabled and not problems:
        example = f"{clusters[0]}->{clusters[1]}" if len(clusters) > 1 else "A->B"
        problems.append(f"no replication flow is enabled: add e.g. `{example}.enabled = true`")

    names = set(MIRROR_SETTINGS.names()) | _engine_names()
    engine_names = _engine_names()
    flows: list[FlowConfig] = []
    for source, target in enabled:
        flow = f"{source}->{target}"
        flow_keys = per_flow[(source, target)]
        for key in flow_keys:
            if key.startswith(CLIENT_ROLES):
                problem = _scoped_key_problem(f"{flow}.", key)
                if problem:
                    unknown_keys.append(problem)
            elif key in names or key in MM2_IGNORED_KEYS or key.startswith(("source.",
                                                                             "target.")):
                pass
            elif _is_client_key(key):
                # MM2 hands a flow's keys to its connectors, whose clients take only their
                # role's (`consumer.`, `producer.`, `admin.`): this one configures nothing.
                warnings.append(
                    f"{flow}.{key} applies to no client (as in MirrorMaker 2): set "
                    f"{source}.{key} and {target}.{key} for every client of those clusters, or "
                    f"{flow}.consumer.{key} / {flow}.producer.{key} for this flow's")
            else:
                hint = _closest(key)
                unknown_keys.append(f"unknown configuration key '{flow}.{key}'"
                                    + (f"; did you mean '{flow}.{hint}'?" if hint else ""))
        clients = {
            "source_consumer": client_config(props, source, "consumer", flow),
            "target_producer": client_config(props, target, "producer", flow),
            "source_admin": client_config(props, source, "admin", flow),
            "target_admin": client_config(props, target, "admin", flow),
        }
        for alias, side in ((source, "source_consumer"), (target, "target_producer")):
            if not clients[side].get("bootstrap.servers", "").strip():
                msg = (f"cluster {alias!r} has no bootstrap servers: set "
                       f"{alias}.bootstrap.servers (needed by flow {flow})")
                if msg not in problems:
                    problems.append(msg)
        for side, alias in (("source_consumer", source), ("source_admin", source),
                            ("target_producer", target), ("target_admin", target)):
            if clients[side].get("bootstrap.servers", "").strip():
                problems.extend(p for p in _client_problems(clients[side], alias)
                                if p not in problems)
        for scope, keys in (("", top), (f"{flow}.", flow_keys)):
            for new, old in (("topics.exclude", "topics.blacklist"),
                             ("config.properties.exclude", "config.properties.blacklist")):
                if new in keys and old in keys:
                    problems.append(f"{scope}{new} and {scope}{old} (its deprecated name) are "
                                    "both set: keep only "
                                    f"{scope}{new}")
        raw = _settings_raw(top, flow_keys, clients["source_consumer"],
                            clients["target_producer"], names)
        if deep:
            raw["use.raw.bytes"] = "false"
        # Process keys (prometheus.port ...) are resolved once, below, not once per flow.
        mirror_raw = {k: v for k, v in raw.items() if k in MIRROR_SETTINGS
                      and MIRROR_SETTINGS[k].scope != "process"}
        engine_raw = {k: v for k, v in raw.items() if k in engine_names}
        engine_raw.setdefault("group.id", f"shallowmirror-{source}-{target}")
        try:
            settings = MIRROR_SETTINGS.resolve(mirror_raw, context=flow, warn_unknown=False)
        except ConfigError as err:
            problems.extend(p for p in err.problems if p not in problems)
            # The engine's keys are checked too: every problem in one run, not one round of
            # the process's keys and then another of the engine's.
            from shallowmirror.engine.config import resolve_settings
            try:
                resolve_settings(engine_raw, context=flow)
            except ConfigError as engine_err:
                problems.extend(p for p in engine_err.problems if p not in problems)
            continue
        if _flow_opts_out_of_exactly_once(flow_keys):
            # A flow's own `A->B.exactly.once = false` wins over MM2's process-wide switch.
            engine_raw["exactly.once.source.support"] = "disabled"
        if settings["replication.factor"] == 0:
            problems.append(f"{flow}: replication.factor must be -1 (the target broker's "
                            "default) or at least 1, got 0 (Kafka refuses a topic with none)")
        if str(engine_raw.get("partition.assignment", "")).strip() == "all" \
                and settings["tasks.max"] > 1:
            problems.append(f"{flow}: partition.assignment=all gives every partition to each "
                            f"engine, so tasks.max must be 1 (it is {settings['tasks.max']}); "
                            "run it in one process only")
        try:
            from shallowmirror.engine.config import exactly_once, resolve_settings
            resolved = resolve_settings(engine_raw, context=flow)
        except ImportError:  # pragma: no cover
            pass
        except ConfigError as err:
            problems.extend(p for p in err.problems if p not in problems)
            continue
        else:
            if exactly_once(resolved) and not settings["use.raw.bytes"]:
                problems.append(f"{flow}: exactly-once runs on the shallow path only; drop "
                                "--deep / use.raw.bytes=false or turn exactly-once off")
                continue
            if resolved["group.protocol"] == "consumer" and not settings["use.raw.bytes"]:
                problems.append(f"{flow}: group.protocol=consumer runs on the shallow path only "
                                "(the deep path's librdkafka consumer joins with the classic "
                                "protocol); drop --deep / use.raw.bytes=false or use "
                                "group.protocol=classic")
                continue
        flows.append(FlowConfig(source, target, settings, engine_raw, **clients))

    for f in flows:
        problem = _same_cluster_problem(f)
        if problem:
            problems.append(problem)
    identity_flows = [f for f in flows if not f.policy.detects_cycles]
    pairs = {(f.source, f.target) for f in identity_flows}
    for f in identity_flows:
        if (f.target, f.source) in pairs and f.source < f.target:
            warnings.append(
                f"flows {f.source}->{f.target} and {f.target}->{f.source} both use "
                "IdentityReplicationPolicy, which cannot detect cycles: give them disjoint "
                "`topics` or records will loop between the clusters")

    by_name = {(f.source, f.target): f for f in flows}
    for f in flows:
        f.opposite = by_name.get((f.target, f.source))
    problems.extend(p for p in reverse_checkpointing_problems(flows) if p not in problems)
    warnings.extend(group_sync_warnings(flows))
    pairs, pair_problems = heartbeat_pairs(
        [alias for f in flows for alias in (f.source, f.target)], top, per_flow,
        lambda s, t: client_config(props, t, "producer", f"{s}->{t}"))
    problems.extend(p for p in pair_problems if p not in problems)

    try:
        process = MIRROR_SETTINGS.resolve(
            {k: v for k, v in top.items() if k in MIRROR_SETTINGS
             and MIRROR_SETTINGS[k].scope == "process"}, warn_unknown=False)
    except ConfigError as err:
        problems.extend(p for p in err.problems if p not in problems)
        process = {}
    if unknown_keys and allow_unknown_keys:
        warnings.extend(unknown_keys)
    elif unknown_keys:
        problems.extend(unknown_keys + [UNKNOWN_KEYS_HINT])
    if problems:
        raise ConfigError(problems)
    for warning in warnings:
        log.warning("%s", warning)
    if ignored:
        log.info("MirrorMaker 2 keys accepted but not implemented by shallowmirror (ignored): "
                 "%s", ", ".join(sorted(ignored)))
    return MirrorConfig(clusters, flows, process, warnings, pairs)


def load_mm2(path: str | Path, **kwargs: Any) -> MirrorConfig:
    """``resolve_mm2`` of a properties file."""
    return resolve_mm2(load_properties(path), **kwargs)


# ---------------------------------------------------------------------------------------------
# MirrorMaker 1


def mm1_include_regex(include: str) -> str:
    """MirrorMaker 1's --include/--whitelist: commas mean '|', spaces and quotes dropped."""
    text = include.strip().strip("\"'").replace(" ", "")
    return text.replace(",", "|")


def _mm1_refresh_seconds(consumer_props: Mapping[str, str], path: str,
                         problems: list[str]) -> float:
    """How often MM1 mode looks for new topics: the consumer's ``metadata.max.age.ms``, as MM1's
    regex subscription does, but at least ``refresh.topics.interval.seconds``' minimum (a
    shorter metadata age is valid for a consumer; the topic scan just does not go faster)."""
    raw = str(consumer_props.get("metadata.max.age.ms", "300000")).strip()
    try:
        ms = int(raw)
    except ValueError:
        problems.append(f"{path}: metadata.max.age.ms: expected a whole number of "
                        f"milliseconds, got {raw!r}")
        return 300.0
    if ms < 0:
        problems.append(f"{path}: metadata.max.age.ms must be at least 0, got {ms}")
        return 300.0
    return max(ms / 1000.0, MIRROR_SETTINGS["refresh.topics.interval.seconds"].minimum or 0.0)


def resolve_mm1(consumer_props: Mapping[str, str], producer_props: Mapping[str, str], *,
                include: str | None, whitelist: str | None = None, num_streams: int = 1,
                offset_commit_interval_ms: int | None = None,
                abort_on_send_failure: bool = True, deep: bool = False,
                consumer_config_path: str = "--consumer.config",
                producer_config_path: str = "--producer.config",
                allow_unknown_keys: bool = False) -> MirrorConfig:
    """MirrorMaker 1 flags as an equivalent MM2 configuration: clusters ``source`` and
    ``target``, one flow, identity topic names, no topic config sync (MM1 has none). A key
    no Kafka consumer (producer) knows is a problem, or with ``allow_unknown_keys`` a
    warning."""
    problems: list[str] = []
    unknown: list[str] = []
    ignored: set[tuple[str, str]] = set()      # (role, key): warned about here, not passed on
    if include and whitelist:
        problems.append("--include and --whitelist (its old name) are both given: keep only "
                        "--include")
    pattern = include or whitelist
    if not pattern or not mm1_include_regex(pattern).strip("|"):
        # ' ', "''" and ',' too: they named no topic, and the run found none to mirror.
        given = f" (got {pattern!r}, which names no topic)" if pattern else ""
        problems.append(f"--include is required (a regex of topics to mirror, e.g. "
                        f"'.*'){given}")
    elif (problem := regex_problem(mm1_include_regex(pattern), shown=pattern)) is not None:
        problems.append(f"--include: {problem}")
    if num_streams < 1:
        problems.append(f"--num.streams must be at least 1, got {num_streams}")
    for path, props, role in ((consumer_config_path, consumer_props, "consumer"),
                              (producer_config_path, producer_props, "producer")):
        if not str(props.get("bootstrap.servers", "")).strip():
            problems.append(f"{path}: bootstrap.servers is required")
        for key in props:
            known, hint = _role_key_hint(role, key)
            if not known:
                ignored.add((role, key))
                unknown.append(f"{path}: unknown key {key!r}: not a Kafka {role} setting"
                               + (f"; did you mean {hint!r}?" if hint else ""))
    refresh_s = _mm1_refresh_seconds(consumer_props, consumer_config_path, problems)
    if unknown and not allow_unknown_keys:
        problems.extend(unknown + [UNKNOWN_KEYS_HINT])
    if problems:
        raise ConfigError(problems)
    for warning in unknown:
        log.warning("%s", warning)
    if not str(consumer_props.get("group.id", "")).strip():
        log.warning("%s has no group.id%s; using shallowmirror-source-target",
                    consumer_config_path, "" if "group.id" not in consumer_props
                    else " (it is empty)")
        consumer_props = {k: v for k, v in consumer_props.items() if k != "group.id"}
    props: dict[str, str] = {
        "clusters": "source, target",
        "source->target.enabled": "true",
        "source->target.topics": mm1_include_regex(pattern or ".*"),
        # MM1 mirrors whatever the regex names; only Kafka's own topics stay behind.
        "source->target.topics.exclude": r"__.*",
        "replication.policy.class": "IdentityReplicationPolicy",
        # Only what --include names: MM2 also copies every `heartbeats` topic, renamed.
        "heartbeats.replication.enabled": "false",
        "sync.topic.configs.enabled": "false",
        # MM1 only reads the source cluster (its ACLs may allow no more): offset syncs go to
        # the target (KIP-716), as checkpoints do.
        "offset-syncs.topic.location": "target",
        "tasks.max": str(num_streams),
        "abort.on.send.failure": str(abort_on_send_failure).lower(),
        # MM1's regex subscription sees new topics at the consumer's metadata refresh.
        "refresh.topics.interval.seconds": str(refresh_s),
    }
    props.update({f"source.consumer.{k}": str(v) for k, v in consumer_props.items()
                  if ("consumer", k) not in ignored})
    props.update({f"target.producer.{k}": str(v) for k, v in producer_props.items()
                  if ("producer", k) not in ignored})
    props["source.bootstrap.servers"] = str(consumer_props["bootstrap.servers"])
    props["target.bootstrap.servers"] = str(producer_props["bootstrap.servers"])
    if offset_commit_interval_ms is not None:
        props["offset.commit.interval.ms"] = str(offset_commit_interval_ms)
    try:
        return resolve_mm2(props, deep=deep, allow_unknown_keys=allow_unknown_keys)
    except ConfigError as err:
        # Said in the terms of the MirrorMaker 2 file made here (`x (source->target): ...`):
        # name the file or the flag the value came from instead.
        origins = {"consumer": consumer_config_path, "producer": producer_config_path}
        raise ConfigError([_mm1_problem(p, consumer_props, producer_props, origins,
                                        offset_commit_interval_ms is not None)
                           for p in err.problems]) from None


def _mm1_problem(problem: str, consumer_props: Mapping[str, str],
                 producer_props: Mapping[str, str], origins: Mapping[str, str],
                 interval_flag: bool) -> str:
    """``problem`` of the MM2 configuration ``resolve_mm1`` made, said of where its value came
    from: ``--consumer.config c.properties: auto.offset.reset: must be ...``."""
    key, sep, rest = problem.partition(" (")
    context, sep2, message = rest.partition("): ")
    if not (sep and sep2) or " " in key:
        return problem
    if key == "offset.commit.interval.ms" and interval_flag:
        return f"--offset.commit.interval.ms: {message}"
    in_consumer, in_producer = key in consumer_props, key in producer_props
    if context == "cluster source" or (in_consumer and not in_producer):
        return f"{origins['consumer']}: {key}: {message}" if in_consumer else problem
    if context == "cluster target" or (in_producer and not in_consumer):
        return f"{origins['producer']}: {key}: {message}" if in_producer else problem
    return problem


def config_reference_markdown() -> str:
    """The configuration reference (mirror keys, then engine keys) as Markdown, for README."""
    parts = [MIRROR_SETTINGS.markdown(), "",
             "Client keys: `<alias>.<key>` (all clients of a cluster), "
             "`<alias>.consumer.<key>`, `<alias>.producer.<key>`, `<alias>.admin.<key>`, and "
             "per flow `A->B.consumer.<key>` / `A->B.producer.<key>`; top-level "
             "`bootstrap.servers`, `security.protocol`, `ssl.*`, `sasl.*` apply to every "
             "cluster. Any mirror or engine key may be set per flow as `A->B.<key>`; a client "
             "key there (`A->B.security.protocol`) configures no client, as in MirrorMaker 2, "
             "and a warning says which keys would. At these "
             "scopes a key must be an Apache Kafka 3.7 Java client's (of that role, under "
             "`consumer.`/`producer.`/`admin.`), a connection key below or a shallowmirror "
             "key; Java client keys shallowmirror does not use are accepted and ignored, "
             "anything else is an unknown key (`A.topic` is a typo, not a setting). "
             "`shallowmirror legacy` checks its `--consumer.config` and `--producer.config` "
             "the same way.", "",
             "MirrorMaker 2 keys accepted and ignored (not implemented): "
             + ", ".join(f"`{k}`" for k in sorted(MM2_IGNORED_KEYS)) + ".", ""]
    table = _engine_table()
    if table is not None:
        # Keys the mirror process owns (metrics.file: one file per process) are documented once.
        parts.append(table.markdown(exclude=MIRROR_SETTINGS.names()))
    return "\n".join(parts)
