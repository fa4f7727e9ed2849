"""The floor under any asyncio mirror: what one Produce request costs the client with no engine.

    .venv/bin/python benchmarks/engine/request_floor.py [--broker kafka|tansu] \\
        [--kafka-home DIR] [--partitions 8] [--batch-bytes 16384,262144] [--megabytes 400] \\
        [--clients asyncio,blocking,native] [--coalesce 1,2,3]

Starts one cluster (``--broker``), creates an 8-partition topic, builds one lz4 batch per
partition per size (~300-byte records up to ``--batch-bytes`` uncompressed, no producer id, so
the broker takes the same bytes again and again) and sends the *same* Produce request (one batch
per partition, stock Kafka's rule) over the project's own connection (``net.BrokerConnection``,
asyncio, the engine's fast path: ``send_with_callback``, the answer handled on the turn that read
it, ``max.in.flight.requests.per.connection`` outstanding). Nothing is fetched, planned, stamped
or acknowledged: the request is encoded (native encoder, a new correlation id each time), written,
its answer read and its error codes checked.

``--coalesce 1,2`` runs the asyncio client waking for every answer and for every two
(``target.answers.per.wakeup``); ``blocking`` is a plain socket without an event loop;
``native`` is a blocking socket from C (``request_floor.c``, compiled here with ``cc``): what a
request costs with no interpreter at all. ``native`` runs once per ``--coalesce`` value too
(``native/N``: SO_RCVLOWAT at N answers, as the mirror's connection sets it), since a client that
wakes for every answer pays a sleep and a wake-up per request that one waking for three does not:
``native/1`` alone overstates what a native mirror must pay in the kernel.
Prints, per batch size, the client's CPU per request and per GB. The difference between two sizes,
divided by the difference of their batches per GB, is the per-batch cost of this loop alone: what
a mirror built on this connection and event loop pays per batch before its engine does anything.
Assert nothing on time; the figures go to RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import tempfile
import time

from kafka.record.default_records import DefaultRecordBatchBuilder

from shallowmirror import codec
from shallowmirror.bench import topics as bench_topics
from shallowmirror.codec.messages import PRODUCE_API_KEY
from shallowmirror.net import Cluster
from shallowmirror.net.protocol import versions
from shallowmirror.testing import clusters as test_clusters

LZ4 = 3
TOPIC = "floor"


def lz4_batch(batch_bytes: int, value_bytes: int, seed: int) -> bytes:
    """One lz4 v2 batch of ~``batch_bytes`` uncompressed records, no producer id (not idempotent,
    so the broker accepts it any number of times)."""
    rnd = random.Random(seed)
    words = [bytes(rnd.choice(b"abcdefghij") for _ in range(8)) for _ in range(64)]
    builder = DefaultRecordBatchBuilder(2, LZ4, False, -1, -1, -1, batch_bytes)
    i = 0
    while True:
        value = b" ".join(rnd.choice(words) for _ in range(value_bytes // 9))[:value_bytes]
        if builder.append(i, 1_700_000_000_000 + i, None, value, []) is None:
            break
        i += 1
    return bytes(builder.build())


async def measure(bootstrap: str, batches: list[bytes], megabytes: int,
                  in_flight: int, coalesce: int = 1) -> dict:
    cluster = Cluster({"bootstrap.servers": bootstrap}, "floor")
    await cluster.start()
    try:
        for _ in range(100):
            await cluster.refresh_metadata([TOPIC])
            leaders = [cluster.leader(TOPIC, p) for p in range(len(batches))]
            if all(leader is not None for leader in leaders):
                break
            await asyncio.sleep(0.2)
        conn = await cluster.connection(leaders[0])
        version = conn.api_version(PRODUCE_API_KEY, versions(PRODUCE_API_KEY))
        parts = [(p, ((memoryview(b),),)) for p, b in enumerate(batches)]
        request_bytes = sum(len(b) for b in batches)
        total = _request_count(megabytes, request_bytes)
        answer_bytes = codec.produce_response_min_bytes(version, [(TOPIC, parts)])
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        state = {"sent": 0, "answered": 0, "outstanding": 0, "measuring": False}

        def send_one() -> None:
            cid = conn.next_correlation_id()
            buffers = codec.encode_produce_request(
                version=version, correlation_id=cid, client_id=conn.client_id,
                transactional_id=None, acks=-1, timeout_ms=30000,
                topics=[(TOPIC, parts)])
            conn.send_with_callback(buffers, cid, on_answer, min_response_bytes=answer_bytes)
            state["sent"] += 1
            state["outstanding"] += 1

        def on_answer(frame, error) -> None:
            state["outstanding"] -= 1
            if error is not None:
                if not done.done():
                    done.set_exception(error)
                return
            response = codec.decode_produce_response(frame, version)
            for _topic, answered in response.topics:
                for part in answered:
                    if part.error_code:
                        if not done.done():
                            done.set_exception(RuntimeError(
                                f"{TOPIC}-{part.partition}: error {part.error_code}"))
                        return
            if not state["measuring"]:
                return
            state["answered"] += 1
            if state["answered"] == total:
                done.set_result(None)
            elif state["sent"] < total:
                send_one()

        for _ in range(100):            # until every partition's leader takes it (new topic)
            cid = conn.next_correlation_id()
            frame = await conn.send_raw(codec.encode_produce_request(
                version=version, correlation_id=cid, client_id=conn.client_id,
                transactional_id=None, acks=-1, timeout_ms=30000,
                topics=[(TOPIC, parts)]), cid, expect_response=True)
            codes = {part.error_code for _t, answered in
                     codec.decode_produce_response(frame, version).topics for part in answered}
            if codes == {0}:
                break
            await asyncio.sleep(0.2)
        else:
            raise RuntimeError(f"{TOPIC}: Produce still answered error codes {codes}")
        for _ in range(20):             # warm up: broker log segments, caches
            send_one()
        while state["outstanding"]:
            await asyncio.sleep(0.01)
        state.update(sent=0, answered=0, measuring=True)
        conn.coalesce_answers(coalesce)     # the mirror's target.answers.per.wakeup
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        cpu0, t0 = time.process_time(), time.monotonic()
        for _ in range(min(in_flight, total)):
            send_one()
        await done
        cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
        return {**_row(total, len(batches), request_bytes, cpu, wall, *_usage_since(ru0)),
                "produce_version": version}
    finally:
        await cluster.close()


def measure_blocking(bootstrap: str, batches: list[bytes], megabytes: int,
                     in_flight: int, version: int, requests: int | None = None) -> dict:
    """The same requests from a plain blocking socket (no event loop): ``in_flight`` written,
    then one more after each answer. What the event loop adds is the difference. ``requests``:
    that many instead of ``megabytes``' worth (and no warm-up)."""
    import socket
    import struct

    host, port = bootstrap.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    parts = [(p, ((memoryview(b),),)) for p, b in enumerate(batches)]
    request_bytes = sum(len(b) for b in batches)
    total = requests or _request_count(megabytes, request_bytes)
    cid = 0
    header = bytearray(4)

    def send_one() -> None:
        nonlocal cid
        cid += 1
        buffers = codec.encode_produce_request(
            version=version, correlation_id=cid, client_id="floor", transactional_id=None,
            acks=-1, timeout_ms=30000, topics=[(TOPIC, parts)])
        data = b"".join(bytes(b) for b in buffers)
        sock.sendall(data)

    def read_answer() -> None:
        view = memoryview(header)
        got = 0
        while got < 4:
            got += sock.recv_into(view[got:])
        size = struct.unpack(">i", header)[0]
        frame = bytearray(size)
        fview = memoryview(frame)
        got = 0
        while got < size:
            got += sock.recv_into(fview[got:])
        response = codec.decode_produce_response(memoryview(frame), version)
        for _topic, answered in response.topics:
            for part in answered:
                if part.error_code:
                    raise RuntimeError(f"{TOPIC}-{part.partition}: error {part.error_code}")

    for _ in range(0 if requests else 20):
        send_one()
        read_answer()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    cpu0, t0 = time.process_time(), time.monotonic()
    sent = 0
    for _ in range(min(in_flight, total)):
        send_one()
        sent += 1
    for _ in range(total):
        read_answer()
        if sent < total:
            send_one()
            sent += 1
    cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
    usage = _usage_since(ru0)
    sock.close()
    return _row(total, len(batches), request_bytes, cpu, wall, *usage)


def build_native_client(workdir: str, name: str = "request_floor") -> str:
    """Compile ``<name>.c`` (beside this file: ``request_floor.c``, or bench_mirror.py's
    ``mirror_floor.c``) with the system's C compiler; return the binary's path."""
    import shutil
    import subprocess

    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        raise SystemExit(f"{name}: the C client needs a C compiler (cc, or $CC)")
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.c")
    binary = os.path.join(workdir, name)
    subprocess.run([compiler, "-O2", "-o", binary, source], check=True)
    return binary


def measure_native(binary: str, bootstrap: str, batches: list[bytes], megabytes: int,
                   in_flight: int, version: int, workdir: str, coalesce: int = 1) -> dict:
    """The same requests from ``request_floor.c``: no interpreter, a blocking socket, the same
    bytes every time (one correlation id), woken once per ``coalesce`` answers. Its answers are
    first checked once from Python."""
    import subprocess

    check = measure_blocking(bootstrap, batches, 0, in_flight, version, requests=1)
    assert check["requests"] == 1
    parts = [(p, ((memoryview(b),),)) for p, b in enumerate(batches)]
    request = b"".join(bytes(b) for b in codec.encode_produce_request(
        version=version, correlation_id=7, client_id="floor", transactional_id=None,
        acks=-1, timeout_ms=30000, topics=[(TOPIC, parts)]))
    path = os.path.join(workdir, "request.bin")
    with open(path, "wb") as f:
        f.write(request)
    request_bytes = sum(len(b) for b in batches)
    total = _request_count(megabytes, request_bytes)
    host, port = bootstrap.rsplit(":", 1)
    out = subprocess.run([binary, host, port, path, str(total), str(in_flight), str(coalesce)],
                         check=True, capture_output=True, text=True).stdout
    got = json.loads(out)
    row = _row(total, len(batches), request_bytes, got["user_s"] + got["system_s"],
               got["wall_s"], got["user_s"], got["system_s"], got["context_switches"])
    row["reads_per_request"] = got["reads"] / total
    row["voluntary_switches_per_request"] = got["voluntary_switches"] / total
    return row


def _request_count(megabytes: int, request_bytes: int) -> int:
    """Requests that carry ``megabytes`` (at least 200)."""
    return max(200, megabytes * 1_000_000 // request_bytes)


def _usage_since(ru0: resource.struct_rusage) -> tuple[float, float, int]:
    """(user s, system s, context switches) of this process since ``ru0``."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return (ru.ru_utime - ru0.ru_utime, ru.ru_stime - ru0.ru_stime,
            (ru.ru_nvcsw - ru0.ru_nvcsw) + (ru.ru_nivcsw - ru0.ru_nivcsw))


def _row(total: int, partitions: int, request_bytes: int, cpu: float, wall: float, user: float,
         system: float, switches: int) -> dict:
    """One measurement of ``total`` requests of ``partitions`` batches, every client alike."""
    gb = total * request_bytes / 1e9
    return {"requests": total, "batches": total * partitions, "request_bytes": request_bytes,
            "cpu_s": cpu, "wall_s": wall, "cpu_us_per_request": cpu / total * 1e6,
            "cpu_s_per_gb": cpu / gb, "batches_per_gb": total * partitions / gb,
            "mb_s": gb * 1000 / wall, "user_us_per_request": user / total * 1e6,
            "system_us_per_request": system / total * 1e6,
            "context_switches_per_request": switches / total}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", choices=("kafka", "tansu"), default="kafka")
    parser.add_argument("--kafka-home", default=os.environ.get("KAFKA_HOME"))
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--batch-bytes", default="16384,262144")
    parser.add_argument("--value-bytes", type=int, default=300)
    parser.add_argument("--megabytes", type=int, default=400,
                        help="bytes sent per size (compressed), in MB")
    parser.add_argument("--in-flight", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--coalesce", default="1,2",
                        help="asyncio client: answers per wake-up to compare (the mirror's "
                             "target.answers.per.wakeup; 1: wake for every answer)")
    parser.add_argument("--clients", default="asyncio,blocking",
                        help="asyncio: the project's connection and event loop; blocking: a "
                             "plain socket, no event loop; native: a blocking socket from C "
                             "(request_floor.c, built with cc), no interpreter; asyncio and "
                             "native run once per --coalesce value")
    args = parser.parse_args()
    sizes = [int(s) for s in args.batch_bytes.split(",")]
    clients = []
    for client in (c.strip() for c in args.clients.split(",") if c.strip()):
        if client in ("asyncio", "native"):
            clients += [f"{client}/{n}" for n in args.coalesce.split(",")]
        else:
            clients.append(client)
    batches = {size: [lz4_batch(size, args.value_bytes, seed=p) for p in range(args.partitions)]
               for size in sizes}
    rows: dict[tuple[str, int], list[dict]] = {(c, size): [] for c in clients for size in sizes}
    scratch = tempfile.TemporaryDirectory(prefix="request-floor-")   # removed at exit
    workdir = scratch.name
    native = build_native_client(workdir) if any(c.startswith("native/") for c in clients) else ""
    with test_clusters.started_clusters(args.broker, "floor",
                                        kafka_home=args.kafka_home) as (cluster,):
        bench_topics.create(cluster.bootstrap, TOPIC, args.partitions)
        # The asyncio client first: it waits for the leaders and learns the Produce version.
        version = asyncio.run(measure(cluster.bootstrap, batches[sizes[0]], 1,
                                      args.in_flight))["produce_version"]
        for rep in range(args.repeat):
            for size in sizes:
                for client in clients:
                    if client.startswith("asyncio/"):
                        row = asyncio.run(measure(cluster.bootstrap, batches[size],
                                                  args.megabytes, args.in_flight,
                                                  int(client.split("/")[1])))
                    elif client.startswith("native/"):
                        row = measure_native(native, cluster.bootstrap, batches[size],
                                             args.megabytes, args.in_flight, version, workdir,
                                             int(client.split("/")[1]))
                    else:
                        row = measure_blocking(cluster.bootstrap, batches[size],
                                               args.megabytes, args.in_flight, version)
                    rows[(client, size)].append(row)
                    print(json.dumps({"client": client, "batch_bytes": size, "repeat": rep,
                                      **row}), flush=True)
    scratch.cleanup()
    print(f"{args.broker}, {args.partitions} partitions, medians of {args.repeat}")
    print("client asyncio/N: the project's connection waking for every N answers; native/N: "
          "C, the same")
    print(f"{'client':>10} {'batch.size':>10} {'batch B':>8} {'requests':>8} {'us/request':>10} "
          f"{'user':>6} {'system':>6} {'CPU s/GB':>8} {'MB/s':>6}")
    for client in clients:
        medians = {}
        for size in sizes:
            ordered = sorted(rows[(client, size)], key=lambda r: r["cpu_s_per_gb"])
            mid = medians[size] = ordered[len(ordered) // 2]
            print(f"{client:>10} {size:>10} {mid['request_bytes'] // args.partitions:>8} "
                  f"{mid['requests']:>8} {mid['cpu_us_per_request']:>10.1f} "
                  f"{mid['user_us_per_request']:>6.1f} {mid['system_us_per_request']:>6.1f} "
                  f"{mid['cpu_s_per_gb']:>8.2f} {mid['mb_s']:>6.0f}")
        if len(sizes) >= 2:
            small, large = medians[sizes[0]], medians[sizes[-1]]
            per_batch = ((small["cpu_s_per_gb"] - large["cpu_s_per_gb"])
                         / (small["batches_per_gb"] - large["batches_per_gb"]) * 1e6)
            print(f"{client:>10} per batch (fit): {per_batch:.2f} us; {sizes[0]} / {sizes[-1]} "
                  f"CPU per GB {small['cpu_s_per_gb'] / large['cpu_s_per_gb']:.2f}x")
    return 0


if __name__ == "__main__":
    from shallowmirror.bench.interrupts import run_script

    raise SystemExit(run_script(main))
