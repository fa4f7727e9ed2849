"""What answers at a cluster's bootstrap addresses when its clients get no Kafka answer: nothing
(refused), something that is not a Kafka listener of the configured security protocol, or an
unknown host. One line for the operator, added to a "cannot reach" message; librdkafka only
says "Broker transport failure" for all of them."""

from __future__ import annotations

import socket

from shallowmirror.net.config import parse_host_port


def listener_hint(bootstrap_servers: str, security_protocol: str = "PLAINTEXT", *,
                  timeout_s: float = 1.0, limit: int = 3) -> str:
    """A hint from a TCP connect to each of the first ``limit`` addresses (blocking, at most
    ``timeout_s`` each); "" when none of them tells anything (each timed out, say)."""
    refused, unknown, accepted = [], [], []
    for entry in [e for e in bootstrap_servers.split(",") if e.strip()][:limit]:
        try:
            host, port = parse_host_port(entry)
        except ValueError:
            continue
        address = f"{host}:{port}"
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                accepted.append(address)
        except socket.gaierror:
            unknown.append(host)
        except ConnectionRefusedError:
            refused.append(address)
        except OSError:
            continue                     # timed out or unreachable: the error says it already
    parts = []
    if refused:
        parts.append(f"nothing listens at {', '.join(refused)}")
    if unknown:
        parts.append(f"unknown host {', '.join(unknown)}")
    if accepted:
        parts.append(f"{', '.join(accepted)} accepts connections but gave no Kafka answer: is it "
                     f"a Kafka listener, and does it expect TLS or SASL (security.protocol is "
                     f"{security_protocol})?")
    return "; ".join(parts)
