"""Client settings for one cluster, read from Kafka-style keys (Java and librdkafka names).

``client_settings(config, alias)`` turns the string map an operator wrote (``bootstrap.servers``,
``security.protocol``, ``sasl.*``, ``ssl.*``, timeouts) into a frozen ``ClientSettings``, reporting
every problem at once as a ``ConfigError``. Both naming traditions are accepted where they differ:
librdkafka's ``sasl.username``/``sasl.password`` and Java's ``sasl.jaas.config``; librdkafka's
``ssl.ca.location`` and Java's ``ssl.truststore.location`` (PEM only: the ``ssl`` module cannot read
JKS). Keys this module does not know are ignored without a warning: the same map also carries
consumer and producer keys that belong to other layers.

This is the one place a cluster's client settings are read. Every client is built from it: the
net layer takes ``ClientSettings``; confluent-kafka (librdkafka) clients take
``librdkafka_connection(config, alias)``, the same validated settings under librdkafka's names
(``sasl.jaas.config`` becomes ``sasl.username``/``sasl.password``, which librdkafka needs: it
refuses Java JAAS lines; ``ssl.truststore.location`` becomes ``ssl.ca.location``, and so on), so
a value the net layer would refuse fails the same way, naming the key, before any client starts.

Out of scope: GSSAPI/Kerberos and OAUTHBEARER (a clear ``ConfigError`` says so).
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shallowmirror.errors import ConfigError
from shallowmirror.settings import Setting, SettingsTable

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

CONNECTION_SETTINGS = SettingsTable(
    "Cluster connection (per cluster; Kafka client names)",
    [
        Setting("bootstrap.servers", "list", None,
                "host:port pairs used to discover the cluster.", scope="cluster"),
        Setting("client.id", "str", "shallowmirror",
                "Client id sent in every request header (broker logs, quotas).", scope="cluster"),
        Setting("security.protocol", "str", "PLAINTEXT", "Transport and authentication.",
                choices=SECURITY_PROTOCOLS, scope="cluster"),
        Setting("sasl.mechanism", "str", "PLAIN", "SASL mechanism when security.protocol is "
                "SASL_*.", scope="cluster"),
        Setting("sasl.username", "str", None, "SASL user (librdkafka name; or sasl.jaas.config).",
                scope="cluster"),
        Setting("sasl.password", "str", None, "SASL password (librdkafka name).", scope="cluster"),
        Setting("sasl.jaas.config", "str", None,
                "Java JAAS line; username=\"...\" password=\"...\" are read from it.",
                scope="cluster"),
        Setting("ssl.ca.location", "str", None, "PEM file (or directory) of CA certificates.",
                scope="cluster"),
        Setting("ssl.truststore.location", "str", None,
                "Java name for the CA file; must be PEM here (convert JKS with keytool -rfc).",
                scope="cluster"),
        Setting("ssl.truststore.type", "str", "PEM", "Only PEM is supported.", scope="cluster"),
        Setting("ssl.truststore.certificates", "str", None, "CA certificates as inline PEM.",
                scope="cluster"),
        Setting("ssl.certificate.location", "str", None, "Client certificate (PEM) for mTLS.",
                scope="cluster"),
        Setting("ssl.key.location", "str", None, "Client private key (PEM) for mTLS.",
                scope="cluster"),
        Setting("ssl.key.password", "str", None, "Password of the client private key.",
                scope="cluster"),
        Setting("ssl.keystore.location", "str", None,
                "Java name for a PEM file holding client key and certificate.", scope="cluster"),
        Setting("ssl.keystore.type", "str", "PEM", "Only PEM is supported.", scope="cluster"),
        Setting("ssl.endpoint.identification.algorithm", "str", "https",
                "'https' checks the broker host name against its certificate; '' or 'none' "
                "does not.", scope="cluster"),
        Setting("enable.ssl.certificate.verification", "bool", True,
                "librdkafka name: false accepts any broker certificate (tests only).",
                scope="cluster"),
        Setting("request.timeout.ms", "int", 30000,
                "A request unanswered this long fails and its connection is closed.",
                minimum=1, scope="cluster"),
        Setting("socket.connection.setup.timeout.ms", "int", 10000,
                "Time allowed for one TCP/TLS/SASL connection attempt.", minimum=1,
                scope="cluster"),
        Setting("reconnect.backoff.ms", "int", 50,
                "First wait before reconnecting to a broker; doubles per failure.", minimum=0,
                scope="cluster"),
        Setting("reconnect.backoff.max.ms", "int", 1000, "Longest wait between reconnects.",
                minimum=0, scope="cluster"),
        Setting("reconnect.deadline.ms", "int", 120000,
                "Give up reaching a broker (ConnectionFailedError) after trying this long.",
                minimum=0, scope="cluster"),
        Setting("metadata.max.age.ms", "int", 300000,
                "Refresh cached metadata at least this often.", minimum=1, scope="cluster"),
        Setting("receive.message.max.bytes", "int", 200 * 1024 * 1024,
                "Largest response frame accepted from a broker.", minimum=1024,
                scope="cluster"),
    ],
)

_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')
_JAAS_MODULES = {
    "PLAIN": "PlainLoginModule",
    "SCRAM-SHA-256": "ScramLoginModule",
    "SCRAM-SHA-512": "ScramLoginModule",
}


@dataclass(frozen=True)
class ClientSettings:
    """What a connection needs to reach and authenticate to one cluster's brokers."""

    alias: str
    bootstrap_servers: tuple[tuple[str, int], ...]
    client_id: str
    security_protocol: str
    sasl_mechanism: str | None
    sasl_username: str | None
    sasl_password: str | None
    ssl_context: ssl.SSLContext | None
    ssl_check_hostname: bool
    request_timeout_ms: int
    connection_setup_timeout_ms: int
    reconnect_backoff_ms: int
    reconnect_backoff_max_ms: int
    reconnect_deadline_ms: int
    metadata_max_age_ms: int
    receive_message_max_bytes: int
    #: The SSL sources as files/PEM (what librdkafka needs; ``ssl_context`` is built from them).
    ssl_ca_location: str | None = None
    ssl_ca_pem: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: str | None = None
    ssl_verify: bool = True

    def shared_addresses(self, other: ClientSettings) -> list[str]:
        """Bootstrap addresses given for both this cluster and ``other`` (hosts compared
        without case), sorted: one cluster used as two, if any. The same cluster behind two
        different names is not found."""
        mine = {(host.lower(), port) for host, port in self.bootstrap_servers}
        theirs = {(host.lower(), port) for host, port in other.bootstrap_servers}
        return [f"{host}:{port}" for host, port in sorted(mine & theirs)]

    @property
    def uses_ssl(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")


#: A host name or IPv4 address (letters, digits, '.', '-', '_'); IPv6 goes in brackets, or bare
#: as hexadecimal digits and colons.
_HOST_NAME = re.compile(r"[A-Za-z0-9._-]+")
_IPV6 = re.compile(r"[0-9A-Fa-f:.]+(%[A-Za-z0-9]+)?")


def parse_host_port(entry: str) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host, port); raises ValueError with the reason."""
    entry = entry.strip()
    if "://" in entry:  # "PLAINTEXT://host:9092" as written in broker listener configs
        entry = entry.split("://", 1)[1]
    host, sep, port = entry.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{entry!r} is not host:port")
    bracketed = host.startswith("[") and host.endswith("]")
    host = host.strip("[]")
    if not bracketed and not (_HOST_NAME.fullmatch(host) or _IPV6.fullmatch(host)):
        # Found here, not after reconnect.deadline.ms as "unknown host" (--check said OK).
        odd = "".join(sorted({c for c in host if not _HOST_NAME.fullmatch(c)}))
        hint = ("; separate addresses with commas" if ";" in odd else
                "; a host name has no spaces" if " " in odd else "")
        raise ValueError(f"host {host!r} in {entry!r} has {odd!r}, which no host name or IP "
                         f"address has{hint}")
    number = int(port)
    if not 0 < number < 65536:
        raise ValueError(f"port {number} in {entry!r} is out of range")
    return host, number


def parse_jaas(jaas: str) -> dict[str, str]:
    """The quoted options of a JAAS line: ``... required username="u" password="p";``."""
    return {key: value.replace('\\"', '"').replace("\\\\", "\\")
            for key, value in _JAAS_OPTION.findall(jaas)}


def unknown_client_keys(config: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """The keys of a program's client ``config`` that no Kafka client takes, each with the
    connection key most like it (or None): ``client_settings`` reads the connection keys and
    ignores the rest, so ``bootstrap.server`` or ``security.protocl`` would be dropped without
    a word (the CLI refuses unknown keys when it reads its files)."""
    from shallowmirror.net.client_keys import ANY_CLIENT_KEYS

    known = ANY_CLIENT_KEYS | set(CONNECTION_SETTINGS.names()) | {"sasl.mechanisms"}
    return [(key, CONNECTION_SETTINGS.closest(key)) for key in config
            if isinstance(key, str) and key not in known]


def client_settings(config: Mapping[str, Any], alias: str) -> ClientSettings:
    """Validate ``config`` for cluster ``alias``; raise ``ConfigError`` listing every problem."""
    raw = {k: v for k, v in config.items() if k in CONNECTION_SETTINGS}
    if "sasl.mechanisms" in config:              # librdkafka's (older) name of the same key
        raw.setdefault("sasl.mechanism", config["sasl.mechanisms"])
    values = CONNECTION_SETTINGS.resolve(raw, context=f"cluster {alias}", warn_unknown=False)
    problems: list[str] = []
    where = f" (cluster {alias})"

    servers: list[tuple[str, int]] = []
    for entry in values["bootstrap.servers"] or []:
        try:
            servers.append(parse_host_port(entry))
        except ValueError as err:
            problems.append(f"bootstrap.servers{where}: {err}")
    if not values["bootstrap.servers"]:
        problems.append(f"bootstrap.servers{where}: required (host:port[,host:port...])")

    protocol = values["security.protocol"]
    mechanism = username = password = None
    if protocol.startswith("SASL_"):
        mechanism = str(values["sasl.mechanism"]).upper()
        username, password = values["sasl.username"], values["sasl.password"]
        if mechanism not in SASL_MECHANISMS:
            problems.append(
                f"sasl.mechanism{where}: {values['sasl.mechanism']!r} is not supported; "
                f"shallowmirror speaks {', '.join(SASL_MECHANISMS)} (no GSSAPI/OAUTHBEARER)")
        jaas = values["sasl.jaas.config"]
        if jaas:
            options = parse_jaas(jaas)
            module = _JAAS_MODULES.get(mechanism, "")
            if module and module not in jaas:
                problems.append(f"sasl.jaas.config{where}: mechanism {mechanism} needs "
                                f"{module}, the line names another login module")
            username = username or options.get("username")
            password = password or options.get("password")
        if mechanism in SASL_MECHANISMS and (not username or password is None):
            problems.append(f"sasl.username/sasl.password{where}: required for "
                            f"{protocol} with {mechanism} (or username=/password= in "
                            "sasl.jaas.config)")

    ssl_context = None
    check_hostname = False
    if protocol in ("SSL", "SASL_SSL"):
        ssl_context, check_hostname = _ssl_context(values, where, problems)

    if values["reconnect.backoff.max.ms"] < values["reconnect.backoff.ms"]:
        problems.append(f"reconnect.backoff.max.ms{where}: must be at least "
                        f"reconnect.backoff.ms ({values['reconnect.backoff.ms']})")
    if problems:
        raise ConfigError(problems)
    return ClientSettings(
        alias=alias,
        bootstrap_servers=tuple(servers),
        client_id=values["client.id"],
        security_protocol=protocol,
        sasl_mechanism=mechanism,
        sasl_username=username,
        sasl_password=password,
        ssl_context=ssl_context,
        ssl_check_hostname=check_hostname,
        request_timeout_ms=values["request.timeout.ms"],
        connection_setup_timeout_ms=values["socket.connection.setup.timeout.ms"],
        reconnect_backoff_ms=values["reconnect.backoff.ms"],
        reconnect_backoff_max_ms=values["reconnect.backoff.max.ms"],
        reconnect_deadline_ms=values["reconnect.deadline.ms"],
        metadata_max_age_ms=values["metadata.max.age.ms"],
        receive_message_max_bytes=values["receive.message.max.bytes"],
        ssl_ca_location=values["ssl.ca.location"] or values["ssl.truststore.location"],
        ssl_ca_pem=values["ssl.truststore.certificates"],
        ssl_certificate_location=(values["ssl.certificate.location"]
                                  or values["ssl.keystore.location"]),
        ssl_key_location=values["ssl.key.location"] or (
            values["ssl.keystore.location"] if not values["ssl.certificate.location"] else None),
        ssl_key_password=values["ssl.key.password"],
        ssl_verify=bool(values["enable.ssl.certificate.verification"]),
    )


#: The keys ``librdkafka_connection`` translates: a librdkafka config built from a user's map
#: takes these from it, never the user's raw values (which may be Java names or JAAS lines).
TRANSLATED_KEYS = frozenset({
    "bootstrap.servers", "client.id", "security.protocol", "sasl.mechanism", "sasl.mechanisms",
    "sasl.username", "sasl.password", "sasl.jaas.config", "ssl.ca.location",
    "ssl.truststore.location", "ssl.truststore.type", "ssl.truststore.certificates",
    "ssl.certificate.location", "ssl.key.location", "ssl.key.password", "ssl.keystore.location",
    "ssl.keystore.type", "ssl.endpoint.identification.algorithm",
    "enable.ssl.certificate.verification", "reconnect.deadline.ms",
})


def librdkafka_connection(config: Mapping[str, Any], alias: str) -> dict[str, str]:
    """The connection keys of ``config`` for a confluent-kafka client, under librdkafka's names.

    Validated by ``client_settings`` (a ``ConfigError`` names every bad key); only the keys
    in ``TRANSLATED_KEYS`` are produced: role keys (``group.id``, ``linger.ms`` ...) are the
    caller's."""
    return librdkafka_from(client_settings(config, alias))


def librdkafka_from(settings: ClientSettings) -> dict[str, str]:
    """``ClientSettings`` under librdkafka's names (see ``librdkafka_connection``)."""
    conf = {
        "bootstrap.servers": ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}"
                                      for h, p in settings.bootstrap_servers),
        "client.id": settings.client_id,
        "security.protocol": settings.security_protocol,
    }
    if settings.uses_sasl:
        assert settings.sasl_mechanism and settings.sasl_username is not None
        conf["sasl.mechanism"] = settings.sasl_mechanism
        conf["sasl.username"] = settings.sasl_username
        conf["sasl.password"] = settings.sasl_password or ""
    if settings.uses_ssl:
        optional = {"ssl.ca.location": settings.ssl_ca_location,
                    "ssl.ca.pem": settings.ssl_ca_pem,
                    "ssl.certificate.location": settings.ssl_certificate_location,
                    "ssl.key.location": settings.ssl_key_location,
                    "ssl.key.password": settings.ssl_key_password}
        conf.update({k: v for k, v in optional.items() if v})
        conf["enable.ssl.certificate.verification"] = "true" if settings.ssl_verify else "false"
        conf["ssl.endpoint.identification.algorithm"] = (
            "https" if settings.ssl_check_hostname else "none")
    return conf


def _ssl_context(values: Mapping[str, Any], where: str,
                 problems: list[str]) -> tuple[ssl.SSLContext | None, bool]:
    """An SSLContext from librdkafka or Java (PEM) keys; problems appended, not raised."""
    for key in ("ssl.truststore.type", "ssl.keystore.type"):
        if str(values[key]).upper() != "PEM":
            problems.append(f"{key}{where}: {values[key]!r} is not supported, only PEM "
                            "(convert: keytool -exportcert -rfc / openssl pkcs12 -nodes)")
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    verify = values["enable.ssl.certificate.verification"]
    algorithm = str(values["ssl.endpoint.identification.algorithm"] or "").strip().lower()
    check_hostname = verify and algorithm not in ("", "none")
    context.check_hostname = check_hostname
    if not verify:
        context.verify_mode = ssl.CERT_NONE
    ca = values["ssl.ca.location"] or values["ssl.truststore.location"]
    try:
        if ca:
            if os.path.isdir(ca):
                context.load_verify_locations(capath=ca)
            else:
                context.load_verify_locations(cafile=ca)
        if values["ssl.truststore.certificates"]:
            context.load_verify_locations(cadata=values["ssl.truststore.certificates"])
    except (OSError, ssl.SSLError) as err:
        problems.append(f"ssl.ca.location/ssl.truststore.location{where}: cannot load {ca!r}: "
                        f"{err}")
    cert = values["ssl.certificate.location"] or values["ssl.keystore.location"]
    key = values["ssl.key.location"]
    if cert or key:
        try:
            context.load_cert_chain(cert or key, keyfile=key or None,
                                    password=values["ssl.key.password"])
        except (OSError, ssl.SSLError) as err:
            problems.append(f"ssl.certificate.location/ssl.key.location{where}: cannot load "
                            f"{cert or key!r}: {err}")
    return context, check_hostname

