"""The external mode's command template."""

from __future__ import annotations

from shallowmirror.bench.modes.external import check_template, command, target_topic_of


def test_placeholders_are_filled_and_checked():
    assert check_template("mm2 {source} {target} {topics_regex}") == []
    problems = check_template("copy {src} {topic}")
    assert len(problems) == 1 and "{src}" in problems[0]
    assert check_template("bad {") != []
    cmd = command("tool --from {source} --to {target} --include '{topics_regex}'",
                  source="a:1", target="b:2", topic="t.1", latency_topic="t.1-latency")
    assert cmd == ["sh", "-c", r"tool --from a:1 --to b:2 --include 't\.1|t\.1\-latency'"]


def test_target_topic_may_be_a_name_or_derived():
    assert target_topic_of("source.{topic}", "orders") == "source.orders"
    assert target_topic_of("mirrored", "orders") == "mirrored"
