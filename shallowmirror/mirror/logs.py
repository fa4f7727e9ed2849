"""Structured logs for the mirror process: every record carries ``flow``, ``topic`` and
``partition`` fields when its message names them, in text and in JSON-lines form.

The fields come from the message text, which names them consistently (``flow A->B: ...`` here,
``topic-partition orders-0`` in the engine's error locations), so every module's log lines are
covered without threading context objects through the code.
"""

from __future__ import annotations

import json
import logging
import re
import time

_FLOW_RE = re.compile(r"\bflows? (?P<flow>[^\s:,]+->[^\s:,()]+)")
_TP_RE = re.compile(r"\btopic-partition (?P<topic>\S+?)-(?P<partition>\d+)\b")


class ContextFilter(logging.Filter):
    """Adds ``flow``/``topic``/``partition`` attributes (None when the message has none)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "flow", None) is None:
            message = record.getMessage()
            m = _FLOW_RE.search(message)
            record.flow = m["flow"] if m else None
            m = _TP_RE.search(message)
            record.topic = m["topic"] if m else getattr(record, "topic", None)
            record.partition = int(m["partition"]) if m else getattr(record, "partition", None)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, flow, topic, partition."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "flow": getattr(record, "flow", None),
            "topic": getattr(record, "topic", None),
            "partition": getattr(record, "partition", None),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(fmt: str) -> None:
    """Switch the root handlers to ``text`` (fields appended when known) or ``json``."""
    root = logging.getLogger()
    handlers = root.handlers or [logging.StreamHandler()]
    if not root.handlers:
        root.addHandler(handlers[0])
    for handler in handlers:
        handler.addFilter(ContextFilter())
        if fmt == "json":
            handler.setFormatter(JsonFormatter())
