"""Prefix identity: deterministic, namespaced, chained ids that extending prompts share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmplane.shared.prefix_chain import (
    Namespace,
    PrefixChain,
    chain_from_segments,
    chat_chain,
    estimate_tokens,
    text_chain,
    token_chain,
)

NS = Namespace("acme", "llama-3-8b-instruct", "support-v3")
CHUNK = 8
Message = dict[str, Any]

roles = st.sampled_from(["system", "user", "assistant", "tool"])
messages: st.SearchStrategy[Message] = st.fixed_dictionaries(
    {"role": roles, "content": st.text(max_size=3 * CHUNK)}
)
conversations = st.lists(messages, min_size=1, max_size=5)
texts = st.text(max_size=6 * CHUNK)
token_lists = st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=6 * CHUNK)


def common_prefix_length(left: Sequence[int], right: Sequence[int]) -> int:
    length = 0
    for a, b in zip(left, right, strict=False):
        if a != b:
            break
        length += 1
    return length


def assert_well_formed(chain: PrefixChain) -> None:
    assert len(chain.ids) == len(chain.tokens) >= 1
    assert all(-(2**63) <= prefix_id < 2**63 for prefix_id in chain.ids)
    assert all(a <= b for a, b in zip(chain.tokens, chain.tokens[1:], strict=False))
    assert chain.root == chain.ids[0]


def test_ids_are_pinned_because_they_are_stored_and_shared_across_producers() -> None:
    """Changing how ids are computed orphans every stored statistic: do it only with a new namespace."""
    system = {"role": "system", "content": "You are helpful."}
    assert chat_chain(NS, [system, {"role": "user", "content": "Hi"}]).ids == (
        -1777644243226529106,
        5005517444896201284,
    )
    assert text_chain(NS, "hello world").ids == (-5043732851076442583,)
    assert token_chain(NS, [1, 2, 3]).ids == (-8575351662992161236,)


@settings(max_examples=200)
@given(conversations, texts, token_lists)
def test_ids_are_deterministic_and_fit_a_signed_bigint(
    conversation: list[Message], text: str, tokens: list[int]
) -> None:
    makers: list[Callable[[], PrefixChain]] = [
        lambda: chat_chain(NS, conversation, chunk_chars=CHUNK),
        lambda: text_chain(NS, text, chunk_chars=CHUNK),
        lambda: token_chain(NS, tokens, chunk_tokens=CHUNK),
    ]
    for make in makers:
        chain = make()
        assert_well_formed(chain)
        assert make() == chain


@pytest.mark.parametrize(
    "other",
    [
        Namespace("globex", NS.model, NS.prompt_rev),
        Namespace(NS.tenant, "mistral-7b", NS.prompt_rev),
        Namespace(NS.tenant, NS.model, "support-v4"),
        Namespace(NS.tenant, NS.model, ""),
    ],
)
def test_ids_are_namespaced(other: Namespace) -> None:
    conversation = [{"role": "user", "content": "same words"}]
    assert other.root_parent() != NS.root_parent()
    assert chat_chain(other, conversation).root != chat_chain(NS, conversation).root
    assert text_chain(other, "same words").root != text_chain(NS, "same words").root
    assert token_chain(other, [1, 2, 3]).root != token_chain(NS, [1, 2, 3]).root


@settings(max_examples=200)
@given(conversations, st.lists(messages, min_size=1, max_size=3))
def test_appending_messages_keeps_the_earlier_ids(conversation: list[Message], more: list[Message]) -> None:
    short = chat_chain(NS, conversation, chunk_chars=CHUNK)
    extended = chat_chain(NS, conversation + more, chunk_chars=CHUNK)
    assert extended.ids[: len(short.ids)] == short.ids
    assert extended.tokens[: len(short.tokens)] == short.tokens
    assert len(extended.ids) > len(short.ids)
    assert not set(extended.ids[len(short.ids) :]) & set(short.ids)


@settings(max_examples=200)
@given(conversations, messages, messages)
def test_diverging_conversations_share_exactly_their_common_messages(
    conversation: list[Message], left: Message, right: Message
) -> None:
    shared = chat_chain(NS, conversation, chunk_chars=CHUNK)
    a = chat_chain(NS, [*conversation, left], chunk_chars=CHUNK)
    b = chat_chain(NS, [*conversation, right], chunk_chars=CHUNK)
    common = common_prefix_length(a.ids, b.ids)
    if left == right:
        assert a == b
    else:
        assert common >= len(shared.ids)
        # Past the shared messages, ids agree only while the two last messages' chunks agree.
        a_tail = chat_chain(NS, [left], chunk_chars=CHUNK)
        b_tail = chat_chain(NS, [right], chunk_chars=CHUNK)
        assert common - len(shared.ids) == common_prefix_length(a_tail.ids, b_tail.ids)


def test_messages_that_differ_only_in_role_never_share_an_id() -> None:
    for content in ("short", "x" * (3 * CHUNK)):
        user = chat_chain(NS, [{"role": "user", "content": content}], chunk_chars=CHUNK)
        system = chat_chain(NS, [{"role": "system", "content": content}], chunk_chars=CHUNK)
        assert not set(user.ids) & set(system.ids)


@settings(max_examples=200)
@given(texts, texts)
def test_text_extending_another_shares_its_whole_chunks(text: str, more: str) -> None:
    short = text_chain(NS, text, chunk_chars=CHUNK)
    extended = text_chain(NS, text + more, chunk_chars=CHUNK)
    whole_chunks = len(text) // CHUNK
    assert extended.ids[:whole_chunks] == short.ids[:whole_chunks]
    if not more:
        assert extended == short
    elif len(text) % CHUNK or not text:
        # The last chunk (or the empty prompt's one empty chunk) grew: from there on, ids differ.
        assert extended.ids[whole_chunks] != short.ids[whole_chunks]
    else:
        assert extended.ids[: len(short.ids)] == short.ids


@pytest.mark.parametrize(
    ("length", "pieces"),
    [
        (1, [1]),
        (CHUNK - 1, [CHUNK - 1]),
        (CHUNK, [CHUNK]),
        (CHUNK + 1, [CHUNK, 1]),
        (5 * CHUNK // 2, [8, 8, 4]),
    ],
)
def test_long_messages_are_cut_into_chunks(length: int, pieces: list[int]) -> None:
    conversation = [{"role": "system", "content": "s"}, {"role": "user", "content": "u" * length}]
    chain = chat_chain(NS, conversation, chunk_chars=CHUNK, count_tokens=len)
    assert len(chain.ids) == 1 + len(pieces)
    assert chain.tokens == tuple(1 + sum(pieces[: i + 1]) for i in range(-1, len(pieces)))


def test_a_chunked_message_followed_by_another_keeps_its_chunk_ids() -> None:
    long = {"role": "user", "content": "abcdefgh" * 3 + "ij"}
    alone = chat_chain(NS, [long], chunk_chars=CHUNK)
    followed = chat_chain(NS, [long, {"role": "assistant", "content": "ok"}], chunk_chars=CHUNK)
    assert len(alone.ids) == 4
    assert followed.ids[:4] == alone.ids
    # Equal chunk text at different positions gets different ids: each id covers the whole prefix.
    assert len(set(alone.ids)) == 4


def test_text_chunks_and_estimated_tokens() -> None:
    chain = text_chain(NS, "a" * (2 * CHUNK + 3), chunk_chars=CHUNK)
    assert len(chain.ids) == 3
    assert chain.tokens == (2, 4, 5)  # estimate_tokens: about four characters a token, at least one
    assert text_chain(NS, "", chunk_chars=CHUNK).tokens == (1,)
    assert [estimate_tokens(s) for s in ("", "a", "abcd", "abcde")] == [1, 1, 1, 2]


@settings(max_examples=200)
@given(token_lists, st.integers(1, 2 * CHUNK))
def test_token_chains_count_tokens_exactly(tokens: list[int], chunk: int) -> None:
    chain = token_chain(NS, tokens, chunk_tokens=chunk)
    assert len(chain.ids) == -(-len(tokens) // chunk)
    assert chain.tokens == tuple(min(len(tokens), chunk * (i + 1)) for i in range(len(chain.ids)))
    assert chain.tokens[-1] == len(tokens)


@settings(max_examples=200)
@given(token_lists, token_lists)
def test_token_chain_extending_another_shares_its_whole_chunks(tokens: list[int], more: list[int]) -> None:
    short = token_chain(NS, tokens, chunk_tokens=CHUNK)
    extended = token_chain(NS, tokens + more, chunk_tokens=CHUNK)
    whole = len(tokens) // CHUNK
    assert extended.ids[:whole] == short.ids[:whole]


@pytest.mark.parametrize(
    "call",
    [
        lambda: chat_chain(NS, [], chunk_chars=CHUNK),
        lambda: chat_chain(NS, [{"role": "user", "content": "x"}], chunk_chars=0),
        lambda: text_chain(NS, "x", chunk_chars=0),
        lambda: token_chain(NS, []),
        lambda: token_chain(NS, [1], chunk_tokens=0),
        lambda: chain_from_segments(NS, [b"a"], [1, 2]),
    ],
)
def test_invalid_arguments_raise_value_error(call: Any) -> None:
    with pytest.raises(ValueError):
        call()


def test_chain_from_segments_accumulates_segment_tokens() -> None:
    chain = chain_from_segments(NS, [b"a", b"b", b"c"], [3, 0, 4])
    assert chain.tokens == (3, 3, 7)
    assert chain_from_segments(NS, [b"a", b"b"], [3, 0]).ids == chain.ids[:2]
