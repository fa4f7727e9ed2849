"""Ids the Kafka test harness writes into ``meta.properties``: Kafka reads them back as ``Uuid``s."""

import base64

from shallowmirror.testing.kafka import _random_uuid


def test_ids_are_16_bytes_in_kafkas_text_form_and_never_look_like_an_option():
    ids = {_random_uuid() for _ in range(2000)}
    assert len(ids) == 2000
    for text in ids:
        assert len(text) == 22 and "=" not in text and not text.startswith("-")
        assert len(base64.urlsafe_b64decode(text + "==")) == 16
