"""Engine settings taken from where a program gives them."""

from __future__ import annotations


def test_request_timeout_given_once_sets_the_engines_and_the_target_connections():
    """In the API the engine's request.timeout.ms (Produce timeout, the wait at a stop) and the
    target client's (how long an answer may take) were two keys: setting one left the other at
    30 s. mm2.properties sets both with one producer key."""
    from shallowmirror.engine import MirrorEngine

    source = {"bootstrap.servers": "127.0.0.1:1"}
    by_client = MirrorEngine(source, {"bootstrap.servers": "127.0.0.1:2",
                                      "request.timeout.ms": "5000"}, topics=["t"])
    assert by_client.settings["request.timeout.ms"] == 5000
    by_engine = MirrorEngine(source, {"bootstrap.servers": "127.0.0.1:2"}, topics=["t"],
                             settings={"request.timeout.ms": 7000})
    assert by_engine.target_config["request.timeout.ms"] == 7000
    both = MirrorEngine(source, {"bootstrap.servers": "127.0.0.1:2",
                                 "request.timeout.ms": 9000}, topics=["t"],
                        settings={"request.timeout.ms": 4000})
    assert (both.settings["request.timeout.ms"], both.target_config["request.timeout.ms"]) == \
        (4000, 9000)
    neither = MirrorEngine(source, {"bootstrap.servers": "127.0.0.1:2"}, topics=["t"])
    assert neither.settings["request.timeout.ms"] == 30000
    assert "request.timeout.ms" not in neither.target_config
