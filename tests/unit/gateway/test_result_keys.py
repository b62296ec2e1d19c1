"""Which requests the result cache may answer, the keys it files them under, and the query embedding."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmplane.services.gateway.openai_request import ClientRequest, Kind, decode
from warmplane.services.gateway.result_keys import (
    Namespace,
    bypass_reason,
    cache_query,
    directive,
    end_user,
    namespace_answers,
    query_literals,
)
from warmplane.services.gateway.result_lookup import answer_key
from warmplane.services.gateway.text_embedding import NgramEmbedder, cosine

GREEDY = {"model": "m", "temperature": 0}


def chat_request(question: str) -> ClientRequest:
    return request(
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}]
    )


def request(kind: Kind = "chat", **body: Any) -> ClientRequest:
    if kind == "chat":
        body.setdefault(
            "messages", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        )
    return decode(msgspec.json.encode({**GREEDY, **body}), kind)


@pytest.mark.parametrize(
    ("control", "lookup", "keep"),
    [
        ("", True, True),
        ("no-cache", False, True),
        ("max-age=0, No-Store", False, False),
        ("private", True, True),
    ],
)
def test_cache_control_is_read_as_a_result_cache_reads_it(control: str, lookup: bool, keep: bool) -> None:
    wanted = directive({"cache-control": control})
    assert (wanted.lookup, wanted.keep, wanted.sampled) == (lookup, keep, False)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({}, None),
        ({"temperature": 0.0, "n": 1}, None),
        ({"temperature": 0.2}, "sampling"),
        ({"temperature": None}, "sampling"),
        ({"temperature": False}, "sampling"),
        ({"n": 3}, "choices"),
        ({"stream": True}, "streaming"),
    ],
)
def test_only_a_greedy_single_answer_unstreamed_request_is_cacheable(
    body: dict[str, Any], reason: str | None
) -> None:
    assert bypass_reason(request(**body), directive({})) == reason
    assert bypass_reason(request(**body), directive({"cache-control": "no-store"})) == "no_store"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"temperature": 0.7}, None),
        ({"temperature": 0.7, "seed": 3}, None),
        ({"temperature": None}, "sampling"),
        ({"temperature": True}, "sampling"),
        ({"temperature": 0.7, "stream": True}, "streaming"),
        ({"temperature": 0.7, "n": 2}, "choices"),
    ],
)
def test_a_sampled_request_is_cacheable_only_when_it_opts_in_and_a_stream_never(
    body: dict[str, Any], reason: str | None
) -> None:
    allow = directive({"x-warmplane-cache": "allow-sampled"})
    assert allow.sampled
    assert bypass_reason(request(**body), allow) == reason
    assert bypass_reason(request(**body), directive({"x-warmplane-cache": "l1"})) is not None
    sampled = cache_query(request(**body)).exact
    assert sampled != cache_query(request()).exact, "a sampled answer never answers a greedy request"


def test_a_request_without_a_temperature_is_sampled_by_the_engine_so_it_is_not_cached() -> None:
    body = msgspec.json.encode({"model": "m", "prompt": "Once upon a time"})
    assert bypass_reason(decode(body, "completions"), directive({})) == "sampling"


def test_fields_that_do_not_change_the_answer_do_not_change_the_key() -> None:
    plain = cache_query(request())
    decorated = cache_query(request(user="u-1", priority=-5, cache_salt="mine", request_id="r", stream=False))
    assert decorated == plain
    assert cache_query(request(max_tokens=9)).exact != plain.exact
    assert cache_query(request(model="other")).exact != plain.exact


def test_the_query_is_the_last_user_message_and_the_context_everything_else() -> None:
    base = [{"role": "system", "content": "Be brief."}]
    one = cache_query(request(messages=[*base, {"role": "user", "content": "What is 2+2?"}]))
    two = cache_query(request(messages=[*base, {"role": "user", "content": "What's 2 + 2"}]))
    parts = [{"type": "text", "text": "What is"}, {"type": "text", "text": "2+2?"}]
    three = cache_query(request(messages=[*base, {"role": "user", "content": parts}]))
    assert (one.text, two.text, three.text) == ("What is 2+2?", "What's 2 + 2", "What is\n2+2?")
    assert one.context == two.context == three.context
    assert one.exact != two.exact
    other_system = cache_query(
        request(messages=[{"role": "system", "content": "Be verbose."}, *user("What is 2+2?")])
    )
    assert other_system.context != one.context


def user(content: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


def test_a_request_with_no_text_query_is_matched_exactly_only() -> None:
    assistant_last = request(messages=[*user("What is 2+2?"), {"role": "assistant", "content": "4"}])
    image = request(
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    )
    tokens = request("completions", prompt=[1, 2, 3])
    assert [cache_query(r).text for r in (assistant_last, image, tokens)] == [None, None, None]
    text = cache_query(request("completions", prompt="Once upon a time"))
    assert text.text == "Once upon a time"
    assert text.context == cache_query(request("completions", prompt="Twice upon a time")).context


def test_answer_keys_separate_tenants_models_and_epochs_whatever_their_names_hold() -> None:
    keys = {
        answer_key(Namespace("a:b", "c", 1), "k"),
        answer_key(Namespace("a", "b:c", 1), "k"),
        answer_key(Namespace("a", "b:c", 2), "k"),
        answer_key(Namespace("a", "b:c", 2), "j"),
    }
    assert len(keys) == 4
    assert all(key.startswith("warmplane:results:v3:") for key in keys)
    epoch_two = namespace_answers(Namespace("a", "b:c", 2))
    assert sorted(key for key in keys if key.startswith(epoch_two)) == sorted(
        answer_key(Namespace("a", "b:c", 2), exact) for exact in "jk"
    ), "an epoch's answers share its prefix, and no other's do"


def test_scoped_by_user_the_keys_belong_to_one_end_user_and_unscoped_to_the_tenant() -> None:
    ann, bob = cache_query(request(), "ann"), cache_query(request(), "bob")
    assert ann.exact != bob.exact and ann.context != bob.context
    assert cache_query(request(user="someone"), "ann") == ann, "the scope, not the body, names the user"
    assert cache_query(request(user="ann")) == cache_query(request(user="bob")) == cache_query(request())


def test_the_end_user_comes_from_the_named_header_or_else_the_body() -> None:
    asked = request(user=" ann ")
    assert end_user(asked, {"x-end-user": "bob"}, "") == "ann"
    assert end_user(asked, {"x-end-user": "bob"}, "x-end-user") == "bob"
    assert end_user(asked, {}, "x-end-user") is None
    assert end_user(request(), {}, "") is None
    assert end_user(request(user="  "), {}, "") is None
    assert end_user(request(user=7), {}, "") is None


def test_the_embedding_ignores_case_punctuation_and_spacing_and_tells_texts_apart() -> None:
    embed = NgramEmbedder().vector
    same = cosine(embed("How do I reset my password?"), embed("how do   I reset my password"))
    assert same == pytest.approx(1.0)
    alike = cosine(embed("What is the capital of France?"), embed("what's the capital of france"))
    apart = cosine(embed("What is the capital of France?"), embed("Explain how photosynthesis works."))
    assert alike > 0.85
    assert apart < 0.3
    assert embed("?!") == [0.0] * 256


@given(st.text(min_size=1, max_size=200))
def test_every_embedding_has_unit_length_or_is_empty(text: str) -> None:
    vector = NgramEmbedder(dimensions=64).vector(text)
    length = sum(value * value for value in vector)
    assert length == pytest.approx(1.0) or length == 0.0
    assert NgramEmbedder(dimensions=64, memory=1).vector(text) == vector


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("What is the 401(k) limit in 2023?", "What is the 401(k) limit in 2024?"),
        ("What is 2 to the power of 10?", "What is 10 to the power of 2?"),
        ("Does this laptop support USB-C charging?", "Does this laptop not support USB-C charging?"),
        ("Is the store open on Sunday?", "Isn't the store open on Sunday?"),
    ],
)
def test_queries_that_differ_in_numbers_or_negation_never_share_a_semantic_context(a: str, b: str) -> None:
    assert query_literals(a) != query_literals(b)
    assert cache_query(chat_request(a)).context != cache_query(chat_request(b)).context


def test_the_same_numbers_and_negation_in_other_words_share_a_context() -> None:
    a, b = "Convert 200,000 yen to dollars, not euros", "Not in euros: 200000 yen in dollars?"
    assert query_literals(a) == query_literals(b) == ("200000", "negated")
    assert cache_query(chat_request(a)).context == cache_query(chat_request(b)).context
