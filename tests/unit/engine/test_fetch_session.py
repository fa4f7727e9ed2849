"""The client side of a KIP-227 fetch session: full first, then only what changed, forgotten
partitions named, and back to full on a session error or a failed request."""

from shallowmirror.engine.fetch_session import (
    FETCH_SESSION_ID_NOT_FOUND,
    INVALID_FETCH_SESSION_EPOCH,
    FetchSession,
)

A0, A1, B0 = ("a", 0), ("a", 1), ("b", 0)


def test_full_request_then_only_changed_partitions():
    s = FetchSession()
    assert s.build({A0: 10, A1: 20}, 100) == (0, 0, [(A0, 10, 100), (A1, 20, 100)], [])
    assert s.answered(0, session_id=77)
    assert (s.session_id, s.epoch) == (77, 1)
    # Nothing changed: an empty incremental request.
    assert s.build({A0: 10, A1: 20}, 100) == (77, 1, [], [])
    assert s.answered(0, 77)
    # A0 moved, B0 is new, A1 is no longer fetched.
    assert s.build({A0: 15, B0: 0}, 100) == (77, 2, [(A0, 15, 100), (B0, 0, 100)], [A1])
    assert s.answered(0, 77)
    assert s.sent == {A0: 15, B0: 0} and s.sent_max_bytes == 100
    assert s.epoch == 3
    # A changed byte limit (every partition of a request asks the same) re-sends them all.
    assert s.build({A0: 15, B0: 0}, 50)[2] == [(A0, 15, 50), (B0, 0, 50)]
    assert s.answered(0, 77)
    assert s.build({A0: 15, B0: 0}, 50)[2:] == ([], [])


def test_a_partition_swapped_for_another_is_forgotten():
    # As many partitions as the session holds, but not the same ones: the one left out is
    # forgotten, the new one sent.
    s = FetchSession()
    s.build({A0: 1, A1: 2}, 100)
    s.answered(0, session_id=9)
    assert s.build({A0: 1, B0: 3}, 100)[2:] == ([(B0, 3, 100)], [A1])
    s.answered(0, 9)
    assert s.sent == {A0: 1, B0: 3}


def test_broker_without_sessions_gets_full_requests():
    s = FetchSession()
    s.build({A0: 1}, 100)
    assert s.answered(0, session_id=0)          # no session created (tansu, a full cache)
    assert s.build({A0: 1}, 100) == (0, 0, [(A0, 1, 100)], [])
    assert s.full_requests == 2 and s.incremental_requests == 0


def test_session_errors_and_failed_requests_go_back_to_full():
    for error in (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH):
        s = FetchSession()
        s.build({A0: 1}, 100)
        s.answered(0, 5)
        s.build({A0: 1}, 100)
        assert not s.answered(error, 0)
        assert s.build({A0: 1}, 100) == (0, 0, [(A0, 1, 100)], [])
    s = FetchSession()
    s.build({A0: 1}, 100)
    s.answered(0, 5)
    s.build({A0: 2}, 100)
    s.reset()                                   # the request failed: its epoch is unknown
    assert s.build({A0: 2}, 100) == (0, 0, [(A0, 2, 100)], [])


def test_epoch_wraps_to_one():
    s = FetchSession()
    s.build({A0: 1}, 100)
    s.answered(0, 5)
    s.epoch = 2**31 - 1
    s.build({A0: 1}, 100)
    s.answered(0, 5)
    assert s.epoch == 1


def test_disabled_sessions_are_sessionless():
    s = FetchSession(enabled=False)
    assert s.build({A0: 1}, 100) == (0, -1, [(A0, 1, 100)], [])
    s.answered(0, 0)
    assert s.build({A0: 1}, 100) == (0, -1, [(A0, 1, 100)], [])


def test_restart_closes_the_session_with_one_full_request():
    s = FetchSession()
    s.build({A0: 10}, 100)
    s.answered(0, session_id=77)
    assert s.holds(A0) and not s.holds(A1)
    # A0 handed to a new owner object at the same position: an incremental request would not
    # make the broker answer it while idle, so the next request is full and closes session 77.
    s.restart()
    assert s.build({A0: 10}, 100) == (77, 0, [(A0, 10, 100)], [])
    assert s.answered(0, session_id=78)
    assert (s.session_id, s.epoch) == (78, 1)
    # Only that once: the request after is incremental again, and a later full one is plain.
    assert s.build({A0: 10}, 100) == (78, 1, [], [])
    s.answered(0, 78)
    s.reset()
    assert s.build({A0: 10}, 100)[:2] == (0, 0)


def test_restart_without_a_session_is_a_plain_full_request():
    s = FetchSession()
    s.restart()
    assert s.build({A0: 1}, 100) == (0, 0, [(A0, 1, 100)], [])
    disabled = FetchSession(enabled=False)
    disabled.restart()
    assert disabled.build({A0: 1}, 100)[:2] == (0, -1)
