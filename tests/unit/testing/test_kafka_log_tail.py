"""A Kafka broker that fails to start logs why once, then dozens of shutdown lines: the start
error shown to the tester must carry the why, not only the tail."""

from pathlib import Path

from shallowmirror.testing.kafka import KafkaCluster


def _cluster(tmp_path: Path, lines: list[str]) -> KafkaCluster:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "server.log").write_text("\n".join(lines) + "\n")
    return KafkaCluster(alias="source", port=1, controller_port=2, cluster_id="x",
                        kafka_home=tmp_path, work_dir=tmp_path)


def test_the_first_errors_come_before_a_tail_that_leaves_them_out(tmp_path):
    lines = ["[t] INFO starting", "[t] ERROR [KafkaServer id=1] Fatal error during startup: "
             "Address already in use", *(f"[t] INFO shutdown step {i}" for i in range(40))]
    text = _cluster(tmp_path, lines).log_tail(30).splitlines()
    assert text[0] == lines[1] and text[1] == "..."
    assert text[2:] == lines[-30:]


def test_a_tail_that_holds_the_error_is_shown_as_it_is(tmp_path):
    lines = ["[t] INFO starting", "[t] ERROR failed", "[t] INFO stopped"]
    assert _cluster(tmp_path, lines).log_tail(30).splitlines() == lines
