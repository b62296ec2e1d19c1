"""Signing control events (`shared/event_signing.py`): what is accepted, what is refused and why, and
a key rotation in three steps. Pure: no broker."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from warmplane.shared.event_signing import EventSigner, SignedTopics
from warmplane.shared.settings import MIN_EVENT_KEY_CHARS, WarmplaneSettings
from warmplane.shared.topics import SIGNATURE_HEADER

OLD = SecretStr("o" * MIN_EVENT_KEY_CHARS)
NEW = SecretStr("n" * MIN_EVENT_KEY_CHARS)
EVENT = b'{"type": "epoch.bumped", "tenant": "acme", "epoch": 3}'


def test_a_signed_event_is_accepted_and_any_change_to_it_is_refused() -> None:
    signer = EventSigner([NEW])
    headers = signer.headers(EVENT)
    assert [name for name, _ in headers] == [SIGNATURE_HEADER]
    assert signer.refusal(EVENT, headers) is None
    assert (
        signer.refusal(EVENT.replace(b"3", b"4"), headers)
        == "badly signed control event: no current key signed it"
    )
    assert signer.refusal(EVENT, []) == "unsigned control event: no warmplane-signature header"
    assert signer.refusal(EVENT, None) == "unsigned control event: no warmplane-signature header"
    twice = headers + headers
    assert signer.refusal(EVENT, twice) == "badly signed control event: not one hmac-sha256 signature"
    other_scheme = [(SIGNATURE_HEADER, b"md5=abc")]
    assert signer.refusal(EVENT, other_scheme) == "badly signed control event: not one hmac-sha256 signature"
    not_base64 = [(SIGNATURE_HEADER, b"hmac-sha256=***")]
    assert signer.refusal(EVENT, not_base64) == "badly signed control event: the signature is not base64"


def test_a_rotation_accepts_either_key_while_both_are_held() -> None:
    signed_by_old = EventSigner([OLD]).headers(EVENT)
    # 1. every service holds [old, new]: still signing with the old key, accepting both.
    during = EventSigner([OLD, NEW])
    # 2. every service holds [new, old]: signing with the new key, still accepting the old one's events.
    swapped = EventSigner([NEW, OLD])
    assert during.refusal(EVENT, swapped.headers(EVENT)) is None
    assert swapped.refusal(EVENT, signed_by_old) is None
    # 3. the old key dropped: its events (an old one replayed, a leaked key) are refused.
    after = EventSigner([NEW])
    assert after.refusal(EVENT, signed_by_old) == "badly signed control event: no current key signed it"
    assert after.refusal(EVENT, swapped.headers(EVENT)) is None


def test_without_keys_nothing_is_signed_or_checked() -> None:
    off = EventSigner([])
    assert not off.enabled and off.headers(EVENT) == [] and off.refusal(EVENT, []) is None
    assert not SignedTopics(off, frozenset({"lifecycle"})).checks("lifecycle")
    on = SignedTopics(EventSigner([NEW]), frozenset({"lifecycle"}))
    assert on.checks("lifecycle") and not on.checks("requests")


def test_settings_refuse_short_event_keys_and_more_than_two() -> None:
    with pytest.raises(ValueError, match=f"at least {MIN_EVENT_KEY_CHARS} characters"):
        WarmplaneSettings(event_keys=[SecretStr("short")])
    with pytest.raises(ValueError, match="at most 2"):
        WarmplaneSettings(event_keys=[OLD, NEW, SecretStr("t" * MIN_EVENT_KEY_CHARS)])
    settings = WarmplaneSettings(event_keys=[NEW, OLD])
    assert "nnnn" not in repr(settings)
