"""The project's exceptions: one base, a location every error can carry, broker codes from one table.

A location is what an operator needs to act: cluster alias, topic, partition, offset, and for
codec errors the byte position inside the buffer that was being parsed.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafka import errors as _kafka_errors


class ShallowMirrorError(Exception):
    """Base of every error shallowmirror raises on purpose."""


@dataclass(frozen=True)
class Where:
    """Where something went wrong; any field may be unknown (None)."""

    cluster: str | None = None
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    position: int | None = None

    def __str__(self) -> str:
        parts = []
        if self.cluster is not None:
            parts.append(f"cluster {self.cluster}")
        if self.topic is not None:
            tp = self.topic if self.partition is None else f"{self.topic}-{self.partition}"
            parts.append(f"topic-partition {tp}")
        elif self.partition is not None:
            parts.append(f"partition {self.partition}")
        if self.offset is not None:
            parts.append(f"offset {self.offset}")
        if self.position is not None:
            parts.append(f"byte {self.position}")
        return ", ".join(parts)


class LocatedError(ShallowMirrorError):
    """An error that names where it happened (topic, partition, offset, byte position)."""

    def __init__(self, message: str, where: Where | None = None):
        self.reason = message
        self.where = where or Where()
        located = str(self.where)
        super().__init__(f"{message} ({located})" if located else message)

    def at(self, **fields) -> LocatedError:
        """Return a copy of this error with more location fields filled in (unknown ones only)."""
        merged = {k: v for k, v in vars(self.where).items()}
        for key, value in fields.items():
            if merged.get(key) is None:
                merged[key] = value
        clone = type(self).__new__(type(self))
        LocatedError.__init__(clone, self.reason, Where(**merged))
        return clone


class CorruptDataError(LocatedError):
    """Bytes from the wire that violate the Kafka format (lengths, magic, CRC, header fields)."""


class CrcMismatchError(CorruptDataError):
    """A RecordBatch whose CRC-32C does not match its bytes."""


class UnsupportedFormatError(LocatedError):
    """Valid Kafka data this path cannot carry (e.g. legacy magic 0/1 without the deep path)."""


class DecompressionLimitError(UnsupportedFormatError):
    """A batch the deep path would have to decompress beyond its configured limit (a
    decompression bomb, or data more compressible than ``deep.max.decompression.ratio``)."""


class ConfigError(ShallowMirrorError):
    """Invalid configuration; lists every problem at once."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in self.problems))


class PartitionsStoppedError(ShallowMirrorError):
    """A run asked to mirror until caught up ended with partitions stopped by errors: caught up
    on the others only. ``stats`` is the run's ``EngineStats`` (each stopped partition's error
    in ``stats.stopped``)."""

    def __init__(self, message: str, stats: object) -> None:
        super().__init__(message)
        self.stats = stats


class OperatorActionRequired(ShallowMirrorError):
    """Refused for a reason only a change of configuration or permissions fixes (a setting the
    broker does not accept, no access to a group): restarting the same work cannot help, so a
    flow stops with it instead of retrying for ever."""


def needs_operator(err: BaseException | None) -> OperatorActionRequired | None:
    """The ``OperatorActionRequired`` in ``err``'s cause chain (or wrapped as ``.error``)."""
    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, OperatorActionRequired):
            return err
        err = getattr(err, "error", None) or err.__cause__
        seen += 1
    return None


class BrokerError(LocatedError):
    """An error code returned by a broker, with its Kafka name and whether retrying can help."""

    def __init__(self, code: int, where: Where | None = None, message: str | None = None):
        self.code = code
        info = broker_error_info(code)
        self.name = info.name
        self.retriable = info.retriable
        text = f"{info.name} (error code {code})"
        if message:
            text += f": {message}"
        super().__init__(text, where)


class ConnectionFailedError(LocatedError):
    """A broker could not be reached or dropped the connection."""


class ReconnectDeadlineError(ConnectionFailedError):
    """A broker stayed unreachable for ``reconnect.deadline.ms``: retrying is given up. At
    start-up or mid-run alike the engine fails with it (a flow is then restarted with backoff,
    or with ``abort.on.send.failure`` the process stops)."""


@dataclass(frozen=True)
class ErrorInfo:
    code: int
    name: str
    retriable: bool
    invalid_metadata: bool


def broker_error_info(code: int) -> ErrorInfo:
    """Kafka's error-code table, as kafka-python generates it from the broker's Errors.java."""
    cls = _kafka_errors.for_code(code)
    name = getattr(cls, "message", cls.__name__)
    return ErrorInfo(
        code=code,
        name=str(name),
        retriable=bool(getattr(cls, "retriable", False)),
        invalid_metadata=bool(getattr(cls, "invalid_metadata", False)),
    )
