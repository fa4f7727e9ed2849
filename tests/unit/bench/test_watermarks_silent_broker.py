"""The bench's ListOffsets fallback against a broker that accepts connections and never answers:
it fails after its answer wait, and Ctrl-C ends it at once rather than after one long call
into librdkafka (which holds Python's signal handlers until it returns)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from shallowmirror.bench.watermarks import LIST_OFFSET_CALL_S, HighWatermarks
from shallowmirror.rdkafka_logs import with_log_config
from shallowmirror.testing.listeners import not_kafka_listener


@pytest.fixture
def silent_broker() -> Iterator[str]:
    """An address that accepts connections and never answers."""
    with not_kafka_listener() as address:
        yield address


def _watermarks_on(bootstrap: str) -> HighWatermarks:
    """A ``HighWatermarks`` already on its ListOffsets fallback (its constructor asks Metadata,
    which a silent broker never gives)."""
    from confluent_kafka import Consumer

    hw = HighWatermarks.__new__(HighWatermarks)
    hw.bootstrap, hw.topic, hw._conns = bootstrap, "orders", {}
    hw._fallback = Consumer(with_log_config({
        "bootstrap.servers": bootstrap, "group.id": "watermarks-test",
        "enable.auto.commit": False}))
    hw.method = "list-offsets"
    return hw


def test_a_silent_broker_fails_after_the_answer_wait(silent_broker: str) -> None:
    hw = _watermarks_on(silent_broker)
    try:
        with pytest.raises(KafkaException) as caught:
            hw._list_offset(TopicPartition("orders", 0), answer_s=3 * LIST_OFFSET_CALL_S)
        # librdkafka's word for it: no broker is up (its connection waits for ApiVersions).
        assert caught.value.args[0].code() in (KafkaError._TIMED_OUT,
                                               KafkaError._ALL_BROKERS_DOWN)
    finally:
        hw.close()


_ASK_FOREVER = textwrap.dedent("""
    import signal, sys
    from confluent_kafka import TopicPartition
    sys.path.insert(0, sys.argv[2])
    from test_watermarks_silent_broker import _watermarks_on
    signal.signal(signal.SIGINT, signal.default_int_handler)
    hw = _watermarks_on(sys.argv[1])
    print("asking", flush=True)
    try:
        hw._list_offset(TopicPartition("orders", 0), answer_s=120)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals as on Linux")
def test_ctrl_c_ends_a_wait_on_a_silent_broker(silent_broker: str) -> None:
    """One call used to wait 10 s for the answer with Ctrl-C held; the process must now end
    well within that (the bound is what the old code could not meet, not a speed claim)."""
    from pathlib import Path

    child = subprocess.Popen([sys.executable, "-c", _ASK_FOREVER, silent_broker,
                              str(Path(__file__).parent)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert child.stdout.readline().strip() == "asking"
        threading.Event().wait(1.0)         # inside a call into librdkafka by now
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=6)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 130, err
    assert out.strip() == "interrupted"
