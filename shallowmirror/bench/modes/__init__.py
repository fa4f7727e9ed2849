"""Mirror modes the harness runs, each as its own process (``python -m ...modes.<name>``).

Every mode takes the same arguments (``common.parser``), mirrors ``--topic`` topics from
``--source`` to ``--target`` (target topic = source topic + ``--target-suffix``) from the start of
the source topics, and runs until SIGTERM or SIGINT, then exits 0 after a clean shutdown. Once
imported and connected, just before its loop, a mode prints ``{"event": "ready", "time": ...}``
on stdout: the harness charges CPU and wall time from there (start-up is reported apart).
``fetch-only`` has no target: it reads the source to its end, prints one JSON line
``{"event": "done", ...}`` on stdout and waits to be stopped like the others (so the harness
samples its CPU at that line, not after its teardown).
"""

#: mode name -> module under shallowmirror.bench.modes ("external" is a user's command line).
MODULES = {
    "shallow": "shallow",
    "deep-confluent": "deep_confluent",
    "deep-kafka-python": "deep_kafka_python",
    "fetch-only": "fetch_only",
}
