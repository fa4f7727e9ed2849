"""RecordBatch and Fetch/Produce wire codec: the native Cython build, or its pure-Python twin.

The choice is made once, at import:
- ``SHALLOWMIRROR_PURE_PYTHON=1`` forces the twin;
- otherwise the native extension is used if it was built, else the twin;
- ``SHALLOWMIRROR_REQUIRE_NATIVE=1`` turns that fallback into an ImportError (CI, production).
``IMPLEMENTATION`` says which one is in use ("native" or "python") for logs, metrics and benchmarks.
The contract both satisfy is ``shallowmirror.codec.contract``.
"""

from __future__ import annotations

import os

from shallowmirror.codec import messages as _py_messages
from shallowmirror.codec import records as _py_records


def _choose():
    if os.environ.get("SHALLOWMIRROR_PURE_PYTHON") == "1":
        return "python", _py_records, _py_messages
    try:
        from shallowmirror.codec import _cmessages, _crecords
    except ImportError as err:
        if os.environ.get("SHALLOWMIRROR_REQUIRE_NATIVE") == "1":
            raise ImportError(
                "shallowmirror: the native codec is required (SHALLOWMIRROR_REQUIRE_NATIVE=1) but "
                f"could not be imported: {err}. Reinstall with a C compiler: pip install -e ."
            ) from err
        return "python", _py_records, _py_messages
    return "native", _crecords, _cmessages


IMPLEMENTATION, _records, _messages = _choose()

split_batches = _records.split_batches
filter_batches = _records.filter_batches
rewrite_for_produce = _records.rewrite_for_produce
stamp_batches = _records.stamp_batches
decode_fetch_response = _messages.decode_fetch_response
encode_produce_request = _messages.encode_produce_request
decode_produce_response = _messages.decode_produce_response
receive_buffer = _messages.receive_buffer

__all__ = [
    "IMPLEMENTATION",
    "split_batches",
    "filter_batches",
    "rewrite_for_produce",
    "stamp_batches",
    "decode_fetch_response",
    "encode_produce_request",
    "decode_produce_response",
    "receive_buffer",
]
