"""cache_salt derivation: always a valid vLLM salt, stable, and different for every (tenant, model, epoch)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from warmplane.shared.cache_salt import SALT_LENGTH, SaltBook, derive_cache_salt

_VALID = re.compile(r"[A-Za-z0-9_-]{43}")
secrets = st.binary(min_size=1, max_size=64).filter(lambda secret: not secret.endswith(b"\0"))
names = st.text(max_size=40)
epochs = st.integers(0, 2**62)


@given(secrets, names, names, epochs)
def test_salt_is_always_valid_for_vllm(secret: bytes, tenant: str, model: str, epoch: int) -> None:
    salt = derive_cache_salt(secret, tenant, model, epoch)
    assert _VALID.fullmatch(salt)
    assert len(salt) == SALT_LENGTH
    assert 1 <= len(salt) <= 128
    assert not set(salt) & {"@", "/", "\\", "\x00"}


@given(secrets, names, names, epochs)
def test_salt_is_deterministic_and_secretstr_equals_bytes(
    secret: bytes, tenant: str, model: str, epoch: int
) -> None:
    text_secret = secret.hex()
    assert derive_cache_salt(secret, tenant, model, epoch) == derive_cache_salt(secret, tenant, model, epoch)
    assert derive_cache_salt(SecretStr(text_secret), tenant, model, epoch) == derive_cache_salt(
        text_secret.encode(), tenant, model, epoch
    )


@given(secrets, names, names, epochs, st.data())
def test_salt_changes_with_each_input(
    secret: bytes, tenant: str, model: str, epoch: int, data: st.DataObject
) -> None:
    salt = derive_cache_salt(secret, tenant, model, epoch)
    other_secret = data.draw(secrets.filter(lambda s: s != secret))
    other_tenant = data.draw(names.filter(lambda t: t != tenant))
    other_model = data.draw(names.filter(lambda m: m != model))
    other_epoch = data.draw(epochs.filter(lambda e: e != epoch))
    assert derive_cache_salt(other_secret, tenant, model, epoch) != salt
    assert derive_cache_salt(secret, other_tenant, model, epoch) != salt
    assert derive_cache_salt(secret, tenant, other_model, epoch) != salt
    assert derive_cache_salt(secret, tenant, model, other_epoch) != salt


def test_names_cannot_be_shifted_between_fields() -> None:
    assert derive_cache_salt(b"k", "ab", "c", 1) != derive_cache_salt(b"k", "a", "bc", 1)
    assert derive_cache_salt(b"k", "a", "b1", 1) != derive_cache_salt(b"k", "a", "b", 11)


def test_known_vector_is_pinned() -> None:
    # A changed salt silently moves every tenant to a cold namespace: this vector must never change.
    salt = derive_cache_salt(SecretStr("s3cret"), "acme", "llama-3-8b-instruct", 7)
    assert salt == "FtU2uxuvR2wNd3LdjJEXUkJ_BK5vyWkcRH5mhia1p2g"
    message = b'["warmplane/cache-salt/v1","acme","llama-3-8b-instruct",7]'
    digest = hmac.new(b"s3cret", message, hashlib.sha256).digest()
    assert salt == base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def test_secret_never_leaks() -> None:
    secret = SecretStr("hunter2-very-secret")
    salt = derive_cache_salt(secret, "acme", "m", 0)
    assert "hunter2" not in salt
    assert "hunter2" not in repr(secret)
    assert "hunter2" not in str(secret)
    with pytest.raises(ValueError) as negative:
        derive_cache_salt(secret, "acme", "m", -1)
    assert "hunter2" not in str(negative.value)


def test_a_secret_ending_in_nul_is_refused_since_hmac_would_take_it_for_the_shorter_one() -> None:
    with pytest.raises(ValueError, match="NUL"):
        derive_cache_salt(b"m\0", "t", "m", 1)
    assert hmac.new(b"m", b"x", "sha256").digest() == hmac.new(b"m\0", b"x", "sha256").digest()


def test_empty_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="secret"):
        derive_cache_salt(b"", "acme", "m", 0)
    with pytest.raises(ValueError, match="secret"):
        derive_cache_salt(SecretStr(""), "acme", "m", 0)


BOOK_SECRETS = {"acme": SecretStr("acme-secret"), "blank": SecretStr("")}


def test_a_book_gives_each_tenants_salt_and_none_for_an_unknown_or_empty_secret() -> None:
    book = SaltBook(BOOK_SECRETS)
    assert book.salt("acme", "m", 3) == derive_cache_salt(SecretStr("acme-secret"), "acme", "m", 3)
    assert book.salt("acme", "m", 4) != book.salt("acme", "m", 3)
    assert book.salt("blank", "m", 3) is None
    assert book.salt("ghost", "m", 3) is None


def test_an_unsalted_tenant_gets_no_salt_and_the_others_keep_theirs() -> None:
    book = SaltBook(BOOK_SECRETS, unsalted=["open"])
    assert book.salt("open", "m", 3) == ""
    assert book.salt("acme", "m", 3) == derive_cache_salt(SecretStr("acme-secret"), "acme", "m", 3)
    assert book.salt("ghost", "m", 3) is None
