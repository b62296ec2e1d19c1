"""What vLLM's prefix cache can hold of a prompt: whole blocks, never the prompt's last token (the engine
always computes it to produce the first output token). The gateway and the middleware judge a request's
resident prefixes by this rule, the warmer its warms and probes, and the KV index its block chains: one
rule, here. Pure: no I/O (issue 22's one home for the full-block rule and the block size)."""

from __future__ import annotations

from typing import Final

DEFAULT_BLOCK_SIZE: Final = 16
"""vLLM's default `--block-size` (its GPU backends), the default of every setting that names an engine's
block size. The CPU backend needs a multiple of 32: the embedded engine runs at 32 (`BLOCK_SIZE` of
`shared/embedded/vllm_engine.py`)."""


def reusable_blocks(prompt_tokens: int, block_size: int) -> int:
    """The whole blocks a repeat of a `prompt_tokens`-long prompt finds cached."""
    return max(prompt_tokens - 1, 0) // block_size


def cacheable_tokens(tokens: int, prompt_tokens: int, block_size: int) -> int:
    """Of the first `tokens` of a `prompt_tokens`-long prompt, those the engine can hold: the whole blocks
    among them, short of the prompt's last token."""
    return block_size * (max(min(tokens, prompt_tokens - 1), 0) // block_size)
