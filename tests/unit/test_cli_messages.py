"""What a newcomer sees from the `shallowmirror` command when the input is wrong (issue 13).

Every test runs the CLI as a subprocess, as a user would, and checks the exact message and exit
status: bad input ends in a message naming what is wrong and where, never in a traceback. None
of these needs a broker: configuration problems are found before anything is contacted.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest


def run_cli(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shallowmirror", *args], capture_output=True,
                          text=True, timeout=timeout_s,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def mm2(tmp_path: Path, *lines: str, name: str = "mm2.properties") -> str:
    path = tmp_path / name
    path.write_text("\n".join(["clusters = A, B", "A->B.enabled = true", *lines]) + "\n")
    return str(path)


GOOD = ("A.bootstrap.servers = 127.0.0.1:19092", "B.bootstrap.servers = 127.0.0.1:19093")


def assert_config_error(result: subprocess.CompletedProcess, *messages: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert "configuration OK" not in result.stdout
    for message in messages:
        assert message in result.stderr, result.stderr


# -- item 1: a pasted `brokers` line is a configuration error, not a success ---------------------


def test_bootstrap_address_with_trailing_text_is_refused_by_check(tmp_path):
    config = mm2(tmp_path, "A.bootstrap.servers = 127.0.0.1:43261  (pid 4162)", GOOD[1])
    for extra in (["--check"], ["--exit-when-caught-up"]):
        result = run_cli("mirror", config, *extra)
        assert_config_error(result, "invalid configuration:",
                            "bootstrap.servers (cluster A): '127.0.0.1:43261  (pid 4162)' is "
                            "not host:port")


# -- item 3: no input ends in a traceback; --check validates every value ---------------------------


def test_an_empty_file_name_is_named_as_such():
    """It said "cannot read : Is a directory" (the empty path is the current directory)."""
    assert_config_error(run_cli("mirror", "", "--check"),
                        "no properties file given (the file name is empty)")


def test_binary_garbage_as_properties_file(tmp_path):
    path = tmp_path / "garbage.properties"
    path.write_bytes(b"clusters = A\n\x8a\xff\x00\x13binary")
    assert_config_error(run_cli("mirror", str(path), "--check"),
                        f"{path} is not a text properties file: byte 0x8a at line 2 (byte 13) "
                        "is not UTF-8")


@pytest.mark.parametrize("line,message", [
    ("prometheus.port = 99999", "prometheus.port: must be a TCP port, 1-65535, got 99999"),
    ("security.protocol = SSL_PLAIN",
     "security.protocol (cluster A): must be one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL, "
     "got 'SSL_PLAIN'"),
    ("B.security.protocol = SASL_SSL\nB.sasl.mechanism = GSSAPI",
     "sasl.mechanism (cluster B): 'GSSAPI' is not supported"),
    ("A.ssl.ca.location = /nonexistent/ca.pem\nA.security.protocol = SSL",
     "ssl.ca.location/ssl.truststore.location (cluster A): cannot load '/nonexistent/ca.pem'"),
    ("tasks.max = many", "tasks.max (A->B): expected a whole number, got 'many'"),
    ("B.producer.acks = 0", "acks (A->B): acks=0 is not supported: the target would not "
     "answer Produce requests"),
    ("B.producer.acks = 2", "acks (A->B): must be one of all, -1, 1, got '2'"),
    # Accepted, then refused by Kafka at run time (and the run waited for ever).
    ("replication.factor = 0", "A->B: replication.factor must be -1 (the target broker's "
     "default) or at least 1, got 0"),
])
def test_check_validates_every_value(tmp_path, line, message):
    assert_config_error(run_cli("mirror", mm2(tmp_path, *GOOD, line), "--check"), message)


def test_prometheus_port_out_of_range_on_the_command_line(tmp_path):
    result = run_cli("mirror", mm2(tmp_path, *GOOD), "--prometheus-port", "99999")
    assert_config_error(result, "--prometheus-port must be a TCP port, 1-65535, got 99999")


def test_prometheus_port_in_use_is_a_message(tmp_path):
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli("mirror", mm2(tmp_path, *GOOD, f"prometheus.port = {port}"))
    assert_config_error(result, f"prometheus.port {port}: cannot listen (Address already in use)")


def test_unwritable_metrics_file_is_a_message(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_cli("mirror", mm2(tmp_path, *GOOD), "--metrics-file", str(blocker / "m.jsonl"))
    assert_config_error(result, f"metrics.file {blocker / 'm.jsonl'}: cannot write to it")


def test_unwritable_summary_json_is_a_message_before_the_run(tmp_path):
    """Found at start, not after a whole run (it was an 'unexpected FileNotFoundError')."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_cli("mirror", mm2(tmp_path, *GOOD), "--summary-json", str(blocker / "s.json"),
                     "--exit-when-caught-up")
    assert_config_error(result, f"--summary-json {blocker / 's.json'}: cannot write to it "
                                "(Not a directory)")
    assert "mirrored" not in result.stdout


# -- item 4: a typo must not widen the mirror ---------------------------------------------------------


def test_unknown_flow_key_is_an_error_with_did_you_mean(tmp_path):
    config = mm2(tmp_path, *GOOD, "A->B.topic = orders", "refresh.topic.interval.seconds = 5")
    result = run_cli("mirror", config, "--check")
    assert_config_error(
        result,
        "unknown configuration key 'A->B.topic'; did you mean 'A->B.topics'?",
        "unknown configuration key 'refresh.topic.interval.seconds'; did you mean "
        "'refresh.topics.interval.seconds'?",
        "--allow-unknown-keys turns these into warnings")


def test_allow_unknown_keys_turns_them_into_warnings(tmp_path):
    config = mm2(tmp_path, *GOOD, "A->B.topic = orders")
    result = run_cli("mirror", config, "--check", "--allow-unknown-keys")
    assert result.returncode == 0, result.stderr
    assert ("WARNING shallowmirror.mirror.config: unknown configuration key 'A->B.topic'; did "
            "you mean 'A->B.topics'?") in result.stderr
    assert "configuration OK" in result.stdout


def test_mirrormaker2_and_connect_keys_are_still_accepted(tmp_path):
    config = mm2(tmp_path, *GOOD, "emit.checkpoints.enabled = false",
                 "offset.storage.replication.factor = 1", "A->B.sync.group.offsets.enabled = true",
                 "A.consumer.max.poll.records = 500", "reconnect.deadline.ms = 60000")
    result = run_cli("mirror", config, "--check")
    assert result.returncode == 0, result.stderr
    assert "configuration OK" in result.stdout


# -- item 8: help ------------------------------------------------------------------------------------


SUBCOMMANDS = ["mirror", "legacy", "load", "bench", "report", "brokers", "info"]


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_every_subcommand_has_a_description_and_an_example(sub):
    result = run_cli(sub, "--help")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    usage, _, rest = text.partition("\n\n")
    assert usage.startswith(f"usage: shallowmirror {sub}")
    description = rest.split("\n\n", 1)[0]
    assert not description.startswith(("options:", "positional arguments:")), text
    assert "\nexamples:\n  shallowmirror " + sub in text, text
    assert "(default: None)" not in text and "(default: [])" not in text
    long_lines = [line for line in text.splitlines() if len(line) > 100]
    assert not long_lines, long_lines


def test_bench_help_says_each_default_once():
    text = run_cli("bench", "--help").stdout
    assert "(default: None)" not in text
    options = " ".join(text.split("\noptions:", 1)[1].split())
    source_help = options.split("--source-bootstrap SOURCE_BOOTSTRAP", 1)[1].split(
        "--target-bootstrap", 1)[0]
    assert source_help.count("(default:") == 1, source_help


def test_log_level_after_the_subcommand_and_bad_levels(tmp_path):
    config = mm2(tmp_path, *GOOD)
    result = run_cli("mirror", config, "--check", "--log-level", "warning")
    assert result.returncode == 0, result.stderr
    for args in (["--log-level", "LOUD", "mirror", config, "--check"],
                 ["mirror", config, "--check", "--log-level", "LOUD"]):
        result = run_cli(*args)
        assert result.returncode == 2
        assert ("argument --log-level: invalid level 'LOUD' (choose from DEBUG, INFO, WARNING, "
                "ERROR)") in result.stderr
    # The level given after the subcommand is the one used: INFO lines disappear at ERROR.
    noisy = mm2(tmp_path, *GOOD, "sync.topic.acls.enabled = false", name="noisy.properties")
    assert "MirrorMaker 2 keys accepted" in run_cli("mirror", noisy, "--check").stderr
    assert run_cli("mirror", noisy, "--check", "--log-level", "ERROR").stderr == ""


@pytest.mark.parametrize("args,message", [
    (("bench", "--records", "abc"),
     "shallowmirror bench: --records: expected a count such as 20000, 20k, 1m or 256KiB, got 'abc'"),
    (("bench", "--batch-bytes", "16KiB,16x"),
     "shallowmirror bench: --batch-bytes: expected a count such as 20000, 20k, 1m or 256KiB, "
     "got '16x'"),
    (("load", "--bootstrap-servers", "127.0.0.1:1", "--topic", "t", "--records", "abc"),
     "argument --records: expected one count such as 20000, 20k, 1m or 256KiB, got 'abc'"),
    (("load", "--bootstrap-servers", "127.0.0.1:1", "--topic", "t", "--batch-bytes", "16kb"),
     "argument --batch-bytes: expected one count such as 20000, 20k, 1m or 256KiB, got '16kb' "
     "(kb could mean either: 16KiB for 16,384 or 16k for 16,000)"),
    # An OverflowError and a ValueError reported as bugs before.
    (("bench", "--records", "99999999999999999999k"),
     "shallowmirror bench: --records 99,999,999,999,999,991,611,392: 99,999,999,999,999,991,"
     "611,392 records of 300 bytes need about"),
    (("bench", "--modes", ""), "shallowmirror bench: --modes: empty list: ''"),
    (("bench", "--records", "0"), "shallowmirror bench: --records must be > 0 (got 0)"),
])
def test_a_count_that_is_not_one_names_the_option(args, message):
    result = run_cli(*args)
    assert result.returncode == 2, result
    assert message in result.stderr
    assert "invalid literal" not in result.stderr and "Traceback" not in result.stderr


def test_bench_output_paths_are_checked_before_any_broker_starts(tmp_path):
    """--out and --report were found unwritable only after the whole matrix had run (and --out
    as an 'unexpected FileNotFoundError')."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_cli("bench", "--records", "1000", "--out", str(blocker / "b.jsonl"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip() == (f"shallowmirror bench: --out {blocker / 'b.jsonl'}: cannot "
                                     "write to it (Not a directory)")
    result = run_cli("bench", "--records", "1000", "--out", str(tmp_path / "b.jsonl"),
                     "--report", str(blocker / "report"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (f"shallowmirror bench: --report {blocker / 'report'}: "
                                     "cannot create the directory (Not a directory)")


@pytest.mark.parametrize("args,message", [
    (("--topic", "bad topic!"), "--topic 'bad topic!': Kafka topic names are 1 to 249 letters, "
                                "digits, '.', '_' or '-' (not '.' or '..')"),
    (("--topic", "t" * 250), "Kafka topic names are 1 to 249 letters"),
    (("--topic", "t", "--partitions", "0"), "--partitions must be at least 1, got 0"),
    (("--topic", "t", "--keys", "-1"), "--keys must not be negative, got -1"),
    (("--topic", "t", "--batch-bytes", "0"), "--batch-bytes must be at least 1, got 0"),
    (("--topic", "t", "--abort-every", "3"), "--abort-every only applies with --transactional"),
    (("--topic", "t", "--transaction-records", "5", "--abort-every", "3"),
     "--transaction-records and --abort-every only apply with --transactional"),
    (("--topic", "t", "--transactional", "--transaction-records", "0"),
     "--transaction-records must be at least 1, got 0"),
    # Each of these below exited 0 having written nothing, wrote another codec than asked, or
    # created the topic and then failed on librdkafka's MSG_SIZE_TOO_LARGE.
    (("--topic", "t", "--records", "0"), "--records must be at least 1, got 0"),
    (("--topic", "t", "--value-bytes", "0"), "--value-bytes must be at least 1, got 0"),
    (("--topic", "t", "--codec", "zstd", "-X", "compression.type=gzip"),
     "-X compression.type=gzip: set the codec with --codec (it is zstd)"),
    (("--topic", "t", "--value-bytes", "20m"), "--value-bytes 20000000 does not fit a record "
                                               "under the producer's message.max.bytes (1000000"),
    # An OverflowError deep in the record planner ("this is a bug") before.
    (("--topic", "t", "--records", "99999999999999999999k"),
     "records of 300 bytes need about"),
])
def test_load_options_are_checked_in_their_own_names_before_any_broker(args, message):
    """Nothing listens on 127.0.0.1:1: each of these is refused before it would be contacted."""
    result = run_cli("load", "--bootstrap-servers", "127.0.0.1:1", *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("shallowmirror load: ") and message in result.stderr, \
        result.stderr
    assert "did not answer" not in result.stderr


@pytest.mark.parametrize("aliases,message", [
    (("A", "A"), "shallowmirror brokers: alias given twice: A"),
    (("bad alias",), "shallowmirror brokers: alias 'bad alias' may hold only letters, digits, '_' "
                     "and '-' (it becomes bad alias.bootstrap.servers in mm2.properties)"),
])
def test_brokers_refuses_aliases_mirror_would_refuse(aliases, message):
    result = run_cli("brokers", *aliases)
    assert result.returncode == 2 and result.stderr.strip() == message, result.stderr
    assert "up on 127.0.0.1" not in result.stderr     # nothing was started


@pytest.mark.parametrize("args", [
    ["mirror", "mm2.properties", "--caught-up-timeout", "nan"],
    ["mirror", "mm2.properties", "--status-interval", "inf"],
    ["offsets", "translate", "mm2.properties", "--group", "g", "--timeout", "nan"],
    ["report", "x", "--window-s", "nan"],
    ["bench", "--run-timeout=-inf"],
])
def test_a_seconds_option_must_be_a_finite_number(args):
    """``--caught-up-timeout nan`` never timed out (every comparison with nan is false)."""
    result = run_cli(*args)
    assert result.returncode == 2, result.stderr
    assert "expected a finite number, got" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args, message", [
    (["--group", ""], "argument --group: a consumer group id cannot be empty"),
    (["--group", "g", "--timeout", "0"], "argument --timeout: expected more than 0 and at most "
                                         "3600 seconds, got '0'"),
    (["--group", "g", "--timeout", "99999"], "expected more than 0 and at most 3600 seconds"),
    (["--group", "g", "--timeout", "-1"], "expected more than 0 and at most 3600 seconds"),
])
def test_offsets_refuses_a_bad_group_or_timeout_as_a_usage_error(tmp_path, args, message):
    """Each was 'unexpected ValueError ... (this is a bug)' from the librdkafka client."""
    result = run_cli("offsets", "translate", str(tmp_path / "mm2.properties"), *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "bug" not in result.stderr


def test_options_after_an_offsets_action_include_log_level_and_unknown_keys(tmp_path):
    """``offsets translate ... --log-level DEBUG`` was 'unrecognized arguments' (the README says
    --log-level goes before or after the command), and --allow-unknown-keys, which its own
    error message recommends, was refused."""
    config = tmp_path / "mm2.properties"
    config.write_text("clusters = A, B\nA.bootstrap.servers = 127.0.0.1:1\n"
                      "B.bootstrap.servers = 127.0.0.1:1\nA->B.enabled = true\nbogus.key = 1\n")
    result = run_cli("offsets", "translate", str(config), "--group", "g", "--log-level", "DEBUG")
    assert result.returncode == 2, result.stderr
    assert "unknown configuration key 'bogus.key'" in result.stderr
    assert "--allow-unknown-keys turns these into warnings" in result.stderr
    result = run_cli("offsets", "translate", str(config), "--group", "g", "--timeout", "1",
                     "--allow-unknown-keys")
    assert "unrecognized arguments" not in result.stderr
    assert "unknown configuration key 'bogus.key'" in result.stderr   # now a warning
    assert "cannot reach" in result.stderr or "did not answer" in result.stderr, result.stderr


@pytest.mark.parametrize("args", [["info"], ["info", "--config-reference"]])
def test_a_reader_that_left_ends_the_command_quietly(args):
    """``shallowmirror info | head -1``: the reader may be gone before everything is written.
    The command then stops as a Unix tool ended by SIGPIPE does (status 141), without a word;
    it said "unexpected BrokenPipeError (this is a bug)" before."""
    read_end, write_end = os.pipe()
    os.close(read_end)               # gone before the first byte: every write fails
    try:
        result = subprocess.run([sys.executable, "-m", "shallowmirror", *args],
                                stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (141, "")


def test_info_says_what_each_optional_part_needs_and_where_it_was_found(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_HOME"}
    result = subprocess.run([sys.executable, "-m", "shallowmirror", "info"], capture_output=True,
                            text=True, timeout=60, env={**env, "KAFKA_HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    keys = [line.split(":", 1)[0] for line in result.stdout.splitlines()[1:]]
    assert keys == ["codec", "engine loops", "send path", "tansu", "kafka", "java"], result.stdout
    assert f"kafka: not found: {tmp_path}" in result.stdout
    assert "java: " in result.stdout and "Traceback" not in result.stderr


def test_legacy_takes_its_dotted_flags_spelt_with_dashes_too(tmp_path):
    """``--consumer-config`` (a common slip for MirrorMaker 1's ``--consumer.config``) was met
    with "required: --consumer.config", the flag given never mentioned."""
    consumer = tmp_path / "c.properties"
    consumer.write_text("bootstrap.servers = 127.0.0.1:19092\ngroup.id = g\n")
    producer = tmp_path / "p.properties"
    producer.write_text("bootstrap.servers = 127.0.0.1:19093\n")
    result = run_cli("legacy", "--consumer-config", str(consumer), "--producer-config",
                     str(producer), "--include", "orders", "--num-streams", "1", "--check")
    assert result.returncode == 0, result.stderr
    assert "configuration OK" in result.stdout


@pytest.mark.parametrize("missing", ["--consumer.config", "--producer.config"])
def test_legacy_names_which_file_it_cannot_read(tmp_path, missing):
    """It said "cannot read nope.properties": two files are given, and which one was not said."""
    good = tmp_path / "c.properties"
    good.write_text("bootstrap.servers = 127.0.0.1:19092\ngroup.id = g\n")
    files = {"--consumer.config": str(good), "--producer.config": str(good)}
    files[missing] = str(tmp_path / "nope.properties")
    result = run_cli("legacy", *[x for kv in files.items() for x in kv], "--include", "orders",
                     "--check")
    assert result.returncode == 2, result.stderr
    assert f"cannot read {missing} {tmp_path / 'nope.properties'}: No such file" in \
        result.stderr


@pytest.mark.parametrize(("argv", "usage"), [
    (("mirror", "mm2.properties", "--bogus"), "usage: shallowmirror mirror "),
    (("offsets", "translate", "mm2.properties", "--group", "g", "--bogus"),
     "usage: shallowmirror offsets translate "),
    (("load", "--bootstrap-servers", "x:1", "--topic", "t", "extra"),
     "usage: shallowmirror load "),
    (("--bogus",), "usage: shallowmirror [-h]"),
])
def test_an_unknown_option_is_refused_with_its_commands_usage(argv, usage):
    """An option no command has was refused with the top-level usage line, which does not show
    the options the command does have."""
    result = run_cli(*argv)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(usage), result.stderr
    assert "unrecognized arguments: " in result.stderr
    assert result.stdout == ""
