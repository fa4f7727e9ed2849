"""Incremental Fetch sessions (KIP-227) for one source broker's fetch loop.

A sessionless Fetch lists every partition in every request: with 10,000 partitions that is
~300 KB sent (and a response entry per partition parsed) even when nothing changed. In a
session the broker remembers each partition's fetch offset and byte limit; later requests send
only partitions that are new or whose fetch offset / limit changed, and name the ones to forget;
the broker answers only partitions that have records, a changed high watermark / log start, or an
error.

Protocol (as the Java client's ``FetchSessionHandler``)::

    no session       session_id 0, epoch 0  -> full request, the broker may create a session
                     (answers session_id != 0) or not (0: stay full; tansu, a full cache)
    in a session     session_id S, epoch 1, 2, ... (wraps to 1) -> changed partitions only,
                     forgotten_topics_data for those no longer fetched
    FETCH_SESSION_ID_NOT_FOUND / INVALID_FETCH_SESSION_EPOCH (top-level error), a lost
    connection or any failed request -> forget the session: the next request is full
    a partition (re)attached while the session holds it -> ``restart``: the next request is
    full with session_id S, epoch 0, which closes S and opens a new session. An incremental
    request would not do: the broker answers a partition only when it has records or its high
    watermark / log start changed since the session last answered it, so an idle partition
    handed to a new owner object (revoked and assigned again in one rebalance) would never tell
    it its high watermark, and "caught up" could not be known until new records arrive.

Invariant: after a successful response, ``sent`` and ``sent_max_bytes`` are exactly what the
broker's session holds (partition -> fetch offset; every partition's max bytes, one value: the
fetch loop asks each partition of a request for the same share). ``fetch.sessions=false`` turns
sessions off (epoch -1: sessionless, every partition every time).

A request costs one native pass over the wanted partitions (``hotpath.changed_positions``)
and a keys comparison here, with no tuple made per unchanged partition: with 10,000 partitions
owned, per-partition Python in the fetch loop was most of the busy topic's CPU per GB
(RESULTS.md section 11).
"""

from __future__ import annotations

from collections.abc import Mapping

from shallowmirror.engine import hotpath

TP = tuple[str, int]

#: Top-level Fetch errors that mean "the session is gone or out of step": fetch in full again.
FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71
SESSION_ERRORS = frozenset({FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH})

_INITIAL_EPOCH = 0
_SESSIONLESS_EPOCH = -1
_MAX_EPOCH = 2**31 - 1


class FetchSession:
    """The client side of one broker's fetch session (see the module docstring)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.session_id = 0
        self.epoch = _INITIAL_EPOCH if enabled else _SESSIONLESS_EPOCH
        #: What the broker's session holds: partition -> fetch offset, and the max bytes every
        #: one of them asks.
        self.sent: Mapping[TP, int] = {}
        self.sent_max_bytes = 0
        #: The request being answered: (wanted, max bytes, full).
        self._pending: tuple[Mapping[TP, int], int, bool] | None = None
        #: Counters for tests and metrics: requests sent in full / incrementally.
        self.full_requests = 0
        self.incremental_requests = 0

        #: A session to close with the next full request (``restart``), else 0.
        self._close_id = 0

    @property
    def active(self) -> bool:
        return self.session_id != 0

    def holds(self, tp: TP) -> bool:
        """Whether the broker's session holds ``tp`` (as of the last answered request)."""
        return tp in self.sent

    def restart(self) -> None:
        """Fetch in full next time, closing the current session on the broker."""
        if self.active:
            self._close_id = self.session_id
        self.reset()

    def build(self, wanted: Mapping[TP, int], max_bytes: int
              ) -> tuple[int, int, list[tuple[TP, int, int]], list[TP]]:
        """(session_id, epoch, partitions to send as (tp, fetch offset, max bytes), partitions
        to forget) for a request that should fetch exactly ``wanted`` (tp -> fetch offset, in
        order), each partition asking ``max_bytes``. ``wanted`` is kept as the session's state
        once answered: the caller must not change it."""
        if not self.active:
            self._pending = (wanted, max_bytes, True)
            self.full_requests += 1
            close_id, self._close_id = self._close_id, 0
            return (close_id if self.enabled else 0, self.epoch,
                    [(tp, off, max_bytes) for tp, off in wanted.items()], [])
        sent = self.sent
        if max_bytes != self.sent_max_bytes:          # every partition's limit changed
            send = [(tp, off, max_bytes) for tp, off in wanted.items()]
        else:
            send = hotpath.changed_positions(wanted, sent, max_bytes)
        forget = ([] if sent.keys() == wanted.keys()
                  else [tp for tp in sent if tp not in wanted])
        self._pending = (wanted, max_bytes, False)
        self.incremental_requests += 1
        return self.session_id, self.epoch, send, forget

    def answered(self, error_code: int, session_id: int) -> bool:
        """Record the response to the last ``build``. False: the session was refused (a
        session error); the response carries no partition data and the caller fetches again,
        in full."""
        pending, self._pending = self._pending, None
        if error_code in SESSION_ERRORS:
            self.reset()
            return False
        if not self.enabled or pending is None:
            return True
        state, max_bytes, full = pending
        if full:
            if session_id == 0:
                self.sent = {}           # the broker made no session: stay full
                return True
            self.session_id = session_id
            self.epoch = 1
        else:
            self.epoch = 1 if self.epoch >= _MAX_EPOCH else self.epoch + 1
        self.sent, self.sent_max_bytes = state, max_bytes
        return True

    def reset(self) -> None:
        """Forget the session (failed request, lost connection): the next request is full."""
        self.session_id = 0
        self.epoch = _INITIAL_EPOCH if self.enabled else _SESSIONLESS_EPOCH
        self.sent = {}
        self.sent_max_bytes = 0
        self._pending = None
