"""RecordBatch and Fetch/Produce wire codec: the native Cython build, or its pure-Python twin.

The choice is made once, at import, by ``shallowmirror.implementation.choose``: the twin when
``SHALLOWMIRROR_PURE_PYTHON=1`` or when the native extension is missing, an ImportError instead
when ``SHALLOWMIRROR_REQUIRE_NATIVE=1``.
``IMPLEMENTATION`` says which one is in use ("native" or "python") for logs, metrics and benchmarks.
The contract both satisfy is ``shallowmirror.codec.contract``.
"""

from __future__ import annotations

from shallowmirror.codec import messages as _py_messages
from shallowmirror.codec import records as _py_records
from shallowmirror.implementation import choose


def _load_native():
    from shallowmirror.codec import _cmessages, _crecords

    return _crecords, _cmessages


IMPLEMENTATION, (_records, _messages) = choose((_py_records, _py_messages), _load_native,
                                               "codec")

split_batches = _records.split_batches
filter_batches = _records.filter_batches
rewrite_for_produce = _records.rewrite_for_produce
stamp_batches = _records.stamp_batches
decode_fetch_response = _messages.decode_fetch_response
encode_produce_request = _messages.encode_produce_request
encode_produce_batches = _messages.encode_produce_batches
decode_produce_response = _messages.decode_produce_response
decode_produce_answer = _messages.decode_produce_answer
produce_response_min_bytes = _messages.produce_response_min_bytes
receive_buffer = _messages.receive_buffer

__all__ = [
    "IMPLEMENTATION",
    "split_batches",
    "filter_batches",
    "rewrite_for_produce",
    "stamp_batches",
    "decode_fetch_response",
    "encode_produce_request",
    "encode_produce_batches",
    "decode_produce_response",
    "decode_produce_answer",
    "produce_response_min_bytes",
    "receive_buffer",
]
