"""Addresses that accept TCP connections and are no Kafka broker, for tests of what a client
says and how long it waits there: one that answers with an HTTP error, one that never answers."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def not_kafka_listener(answer: bytes | None = None) -> Iterator[str]:
    """``127.0.0.1:<port>`` accepting connections until the block ends. Each connection gets
    ``answer`` and is closed, or with ``answer=None`` is held open and never answered (a broker
    that hangs, or a listener that expects TLS)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    done = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            if answer is None:
                held.append(conn)
                continue
            with conn, contextlib.suppress(OSError):
                conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        done.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


#: What ``not_kafka_listener`` answers as an HTTP server would.
HTTP_BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"
