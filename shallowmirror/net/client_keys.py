"""The configuration keys of Apache Kafka 3.7's Java clients, by client role.

MirrorMaker 2 users carry Java client settings into ``mm2.properties`` (``A.ssl.truststore.type``,
``A.consumer.max.poll.records``); shallowmirror reads the ones it implements and ignores the
rest, as MirrorMaker 2 ignores what a client does not use. A cluster- or role-scoped key that is
none of these, and no shallowmirror key either, is a typo (``A.topic`` for ``topics``), reported
as an unknown key. Generated from the Kafka 3.7.0 distribution's clients jar
(``ConsumerConfig.configNames()``, ``ProducerConfig.configNames()``,
``AdminClientConfig.configNames()``, printed by a three-line Java program run with
``java -cp "$KAFKA_HOME/libs/*"``); a data table, not logic.
"""

from __future__ import annotations

CONSUMER_KEYS = frozenset({
    "allow.auto.create.topics", "auto.commit.interval.ms", "auto.include.jmx.reporter",
    "auto.offset.reset", "bootstrap.servers", "check.crcs", "client.dns.lookup", "client.id",
    "client.rack", "connections.max.idle.ms", "default.api.timeout.ms", "enable.auto.commit",
    "enable.metrics.push", "exclude.internal.topics", "fetch.max.bytes", "fetch.max.wait.ms",
    "fetch.min.bytes", "group.id", "group.instance.id", "group.protocol",
    "group.remote.assignor", "heartbeat.interval.ms", "interceptor.classes",
    "internal.leave.group.on.close", "internal.throw.on.fetch.stable.offset.unsupported",
    "isolation.level", "key.deserializer", "max.partition.fetch.bytes", "max.poll.interval.ms",
    "max.poll.records", "metadata.max.age.ms", "metric.reporters", "metrics.num.samples",
    "metrics.recording.level", "metrics.sample.window.ms", "partition.assignment.strategy",
    "receive.buffer.bytes", "reconnect.backoff.max.ms", "reconnect.backoff.ms",
    "request.timeout.ms", "retry.backoff.max.ms", "retry.backoff.ms",
    "sasl.client.callback.handler.class", "sasl.jaas.config", "sasl.kerberos.kinit.cmd",
    "sasl.kerberos.min.time.before.relogin", "sasl.kerberos.service.name",
    "sasl.kerberos.ticket.renew.jitter", "sasl.kerberos.ticket.renew.window.factor",
    "sasl.login.callback.handler.class", "sasl.login.class", "sasl.login.connect.timeout.ms",
    "sasl.login.read.timeout.ms", "sasl.login.refresh.buffer.seconds",
    "sasl.login.refresh.min.period.seconds", "sasl.login.refresh.window.factor",
    "sasl.login.refresh.window.jitter", "sasl.login.retry.backoff.max.ms",
    "sasl.login.retry.backoff.ms", "sasl.mechanism", "sasl.oauthbearer.clock.skew.seconds",
    "sasl.oauthbearer.expected.audience", "sasl.oauthbearer.expected.issuer",
    "sasl.oauthbearer.jwks.endpoint.refresh.ms",
    "sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms",
    "sasl.oauthbearer.jwks.endpoint.retry.backoff.ms", "sasl.oauthbearer.jwks.endpoint.url",
    "sasl.oauthbearer.scope.claim.name", "sasl.oauthbearer.sub.claim.name",
    "sasl.oauthbearer.token.endpoint.url", "security.protocol", "security.providers",
    "send.buffer.bytes", "session.timeout.ms", "socket.connection.setup.timeout.max.ms",
    "socket.connection.setup.timeout.ms", "ssl.cipher.suites", "ssl.enabled.protocols",
    "ssl.endpoint.identification.algorithm", "ssl.engine.factory.class", "ssl.key.password",
    "ssl.keymanager.algorithm", "ssl.keystore.certificate.chain", "ssl.keystore.key",
    "ssl.keystore.location", "ssl.keystore.password", "ssl.keystore.type", "ssl.protocol",
    "ssl.provider", "ssl.secure.random.implementation", "ssl.trustmanager.algorithm",
    "ssl.truststore.certificates", "ssl.truststore.location", "ssl.truststore.password",
    "ssl.truststore.type", "value.deserializer"
})

PRODUCER_KEYS = frozenset({
    "acks", "auto.include.jmx.reporter", "batch.size", "bootstrap.servers", "buffer.memory",
    "client.dns.lookup", "client.id", "compression.type", "connections.max.idle.ms",
    "delivery.timeout.ms", "enable.idempotence", "enable.metrics.push", "interceptor.classes",
    "key.serializer", "linger.ms", "max.block.ms", "max.in.flight.requests.per.connection",
    "max.request.size", "metadata.max.age.ms", "metadata.max.idle.ms", "metric.reporters",
    "metrics.num.samples", "metrics.recording.level", "metrics.sample.window.ms",
    "partitioner.adaptive.partitioning.enable", "partitioner.availability.timeout.ms",
    "partitioner.class", "partitioner.ignore.keys", "receive.buffer.bytes",
    "reconnect.backoff.max.ms", "reconnect.backoff.ms", "request.timeout.ms", "retries",
    "retry.backoff.max.ms", "retry.backoff.ms", "sasl.client.callback.handler.class",
    "sasl.jaas.config", "sasl.kerberos.kinit.cmd", "sasl.kerberos.min.time.before.relogin",
    "sasl.kerberos.service.name", "sasl.kerberos.ticket.renew.jitter",
    "sasl.kerberos.ticket.renew.window.factor", "sasl.login.callback.handler.class",
    "sasl.login.class", "sasl.login.connect.timeout.ms", "sasl.login.read.timeout.ms",
    "sasl.login.refresh.buffer.seconds", "sasl.login.refresh.min.period.seconds",
    "sasl.login.refresh.window.factor", "sasl.login.refresh.window.jitter",
    "sasl.login.retry.backoff.max.ms", "sasl.login.retry.backoff.ms", "sasl.mechanism",
    "sasl.oauthbearer.clock.skew.seconds", "sasl.oauthbearer.expected.audience",
    "sasl.oauthbearer.expected.issuer", "sasl.oauthbearer.jwks.endpoint.refresh.ms",
    "sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms",
    "sasl.oauthbearer.jwks.endpoint.retry.backoff.ms", "sasl.oauthbearer.jwks.endpoint.url",
    "sasl.oauthbearer.scope.claim.name", "sasl.oauthbearer.sub.claim.name",
    "sasl.oauthbearer.token.endpoint.url", "security.protocol", "security.providers",
    "send.buffer.bytes", "socket.connection.setup.timeout.max.ms",
    "socket.connection.setup.timeout.ms", "ssl.cipher.suites", "ssl.enabled.protocols",
    "ssl.endpoint.identification.algorithm", "ssl.engine.factory.class", "ssl.key.password",
    "ssl.keymanager.algorithm", "ssl.keystore.certificate.chain", "ssl.keystore.key",
    "ssl.keystore.location", "ssl.keystore.password", "ssl.keystore.type", "ssl.protocol",
    "ssl.provider", "ssl.secure.random.implementation", "ssl.trustmanager.algorithm",
    "ssl.truststore.certificates", "ssl.truststore.location", "ssl.truststore.password",
    "ssl.truststore.type", "transaction.timeout.ms", "transactional.id", "value.serializer"
})

ADMIN_KEYS = frozenset({
    "auto.include.jmx.reporter", "bootstrap.controllers", "bootstrap.servers",
    "client.dns.lookup", "client.id", "connections.max.idle.ms", "default.api.timeout.ms",
    "enable.metrics.push", "metadata.max.age.ms", "metric.reporters", "metrics.num.samples",
    "metrics.recording.level", "metrics.sample.window.ms", "receive.buffer.bytes",
    "reconnect.backoff.max.ms", "reconnect.backoff.ms", "request.timeout.ms", "retries",
    "retry.backoff.max.ms", "retry.backoff.ms", "sasl.client.callback.handler.class",
    "sasl.jaas.config", "sasl.kerberos.kinit.cmd", "sasl.kerberos.min.time.before.relogin",
    "sasl.kerberos.service.name", "sasl.kerberos.ticket.renew.jitter",
    "sasl.kerberos.ticket.renew.window.factor", "sasl.login.callback.handler.class",
    "sasl.login.class", "sasl.login.connect.timeout.ms", "sasl.login.read.timeout.ms",
    "sasl.login.refresh.buffer.seconds", "sasl.login.refresh.min.period.seconds",
    "sasl.login.refresh.window.factor", "sasl.login.refresh.window.jitter",
    "sasl.login.retry.backoff.max.ms", "sasl.login.retry.backoff.ms", "sasl.mechanism",
    "sasl.oauthbearer.clock.skew.seconds", "sasl.oauthbearer.expected.audience",
    "sasl.oauthbearer.expected.issuer", "sasl.oauthbearer.jwks.endpoint.refresh.ms",
    "sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms",
    "sasl.oauthbearer.jwks.endpoint.retry.backoff.ms", "sasl.oauthbearer.jwks.endpoint.url",
    "sasl.oauthbearer.scope.claim.name", "sasl.oauthbearer.sub.claim.name",
    "sasl.oauthbearer.token.endpoint.url", "security.protocol", "security.providers",
    "send.buffer.bytes", "socket.connection.setup.timeout.max.ms",
    "socket.connection.setup.timeout.ms", "ssl.cipher.suites", "ssl.enabled.protocols",
    "ssl.endpoint.identification.algorithm", "ssl.engine.factory.class", "ssl.key.password",
    "ssl.keymanager.algorithm", "ssl.keystore.certificate.chain", "ssl.keystore.key",
    "ssl.keystore.location", "ssl.keystore.password", "ssl.keystore.type", "ssl.protocol",
    "ssl.provider", "ssl.secure.random.implementation", "ssl.trustmanager.algorithm",
    "ssl.truststore.certificates", "ssl.truststore.location", "ssl.truststore.password",
    "ssl.truststore.type"
})

#: A role's keys by the prefix that scopes a key to it (``consumer.``, ``producer.``, ``admin.``).
KEYS_OF_ROLE = {"consumer": CONSUMER_KEYS, "producer": PRODUCER_KEYS, "admin": ADMIN_KEYS}
#: Any Java client's keys (a cluster-scoped key reaches every client of the cluster).
ANY_CLIENT_KEYS = CONSUMER_KEYS | PRODUCER_KEYS | ADMIN_KEYS
