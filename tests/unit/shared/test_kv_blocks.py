"""The full-block rule: whole blocks, never the prompt's last token (NOTES-parts' measured rule)."""

from __future__ import annotations

import pytest

from warmplane.shared.kv_blocks import cacheable_tokens, reusable_blocks


@pytest.mark.parametrize(
    ("prompt_tokens", "blocks"), [(0, 0), (1, 0), (32, 0), (33, 1), (64, 1), (65, 2), (2000, 62)]
)
def test_a_repeat_reuses_the_whole_blocks_before_the_last_token(prompt_tokens: int, blocks: int) -> None:
    assert reusable_blocks(prompt_tokens, 32) == blocks
    assert cacheable_tokens(prompt_tokens, prompt_tokens, 32) == 32 * blocks


def test_a_prefix_holds_its_whole_blocks_short_of_the_prompts_last_token() -> None:
    assert cacheable_tokens(100, prompt_tokens=200, block_size=32) == 96
    assert cacheable_tokens(200, prompt_tokens=200, block_size=32) == 192
    assert cacheable_tokens(20, prompt_tokens=200, block_size=32) == 0
    assert cacheable_tokens(50, prompt_tokens=0, block_size=16) == 0
