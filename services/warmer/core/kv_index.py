"""What an engine's prefix cache holds, folded from its KV cache events. Pure: no I/O.

vLLM publishes a batch of events per engine step, each batch numbered (design notes on the parts:
`BlockStored` with the new blocks' hashes, their parent's hash, their token ids, the block size and,
per block, its extra keys (the first block's carry the request's `cache_salt`); `BlockRemoved` with
evicted hashes; `AllBlocksCleared` when the cache is reset or the engine sleeps).

The index does not recompute vLLM's block hashes (an engine detail that changes between releases): it
learns them. Each stored block is filed under (its parent's hash, a digest of its tokens, its extra keys),
so a prompt's blocks are found from the root by its token ids alone, the way the engine looks them up.

Contracts:
- `holds(chain)` is true iff every block of `chain` (from `block_chain`) is stored, walking from the root:
  a removed block breaks the chain after it, as it does in the engine's own lookup.
- `accept(seq)` says whether a batch numbered `seq` follows the last one without a gap. The index is
  `complete` while every batch since the engine's first (sequence 0) or since a clear was applied;
  a gap nobody filled (`lose`) makes it incomplete until the next `AllBlocksCleared`.
- `removed_since(chain, seq)` is true iff a block of `chain` was removed by a batch after `seq` (of the
  last `removals_kept` removals): a probe's answer stands for what the index cannot see only until then.
- Blocks of another medium (offloaded to CPU or storage) or of another KV cache group are not the prefix
  cache a request reads first; they are ignored.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from warmplane.shared.kv_blocks import reusable_blocks

_CACHED_MEDIA: Final = frozenset({None, "GPU"})
REMOVALS_KEPT: Final = 65_536
"""Removed blocks remembered with the batch that removed them: a bound, so memory stays flat on a busy
engine, chosen to outlast many assessment intervals (within one of which a probe's answer needs checking)
even on a GPU evicting thousands of blocks a second."""
BlockKey = tuple[Hashable, int, Hashable]
"""(parent block hash or None for a first block, digest of the block's tokens, its extra keys)."""


@dataclass(frozen=True, slots=True)
class BlockChain:
    """A prompt's full blocks as the index looks them up: the first block's extra keys (the salt) and a
    digest of each block's tokens. Only blocks a repeat of the prompt would hit: vLLM always recomputes
    the last token, so a prompt of n tokens reuses (n - 1) // block_size of them."""

    first_extra: Hashable
    digests: tuple[int, ...]


def _digest(tokens: Sequence[int]) -> int:
    return int.from_bytes(hashlib.blake2b(array("q", tokens).tobytes(), digest_size=8).digest(), "big")


def block_chain(token_ids: Sequence[int], block_size: int, cache_salt: str | None) -> BlockChain:
    """The chain of a prompt of `token_ids` under `cache_salt`, in blocks of `block_size` tokens."""
    count = reusable_blocks(len(token_ids), block_size)
    digests = tuple(_digest(token_ids[i * block_size : (i + 1) * block_size]) for i in range(count))
    return BlockChain(_extra([cache_salt] if cache_salt else None), digests)


def _extra(keys: Any) -> Hashable:
    """Extra keys as the index files them: None, or a tuple of their values."""
    if keys is None:
        return None
    if isinstance(keys, list | tuple):
        return tuple(_extra(key) if isinstance(key, list | tuple) else key for key in keys)
    return keys if isinstance(keys, Hashable) else repr(keys)


@dataclass
class KvIndex:
    """The blocks one engine holds, as far as its events told."""

    complete: bool = True
    last_seq: int | None = None
    gaps: int = 0
    """Batches lost for good, counted once per gap."""
    clears: int = 0
    """`AllBlocksCleared` events applied."""
    removals_kept: int = REMOVALS_KEPT
    _block: dict[BlockKey, Hashable] = field(default_factory=dict)
    _key_of: dict[Hashable, BlockKey] = field(default_factory=dict)
    _removed: dict[BlockKey, tuple[Hashable, int]] = field(default_factory=dict)
    """Removed blocks, oldest first: their hash and the batch that removed them."""

    def __len__(self) -> int:
        return len(self._key_of)

    def accept(self, seq: int) -> bool:
        """Whether batch `seq` follows the last one applied (the first one ever must be 0). A batch at
        or before the last is a duplicate the caller skips; see `expects`."""
        return seq == self.expects()

    def expects(self) -> int:
        """The sequence number of the next batch."""
        return 0 if self.last_seq is None else self.last_seq + 1

    def lose(self, up_to: int) -> None:
        """Batches before `up_to` are lost for good: the index may now miss blocks (or keep removed ones)
        until the cache is next cleared."""
        self.gaps += 1
        self.complete = False
        self.last_seq = up_to - 1

    def doubt(self) -> None:
        """Something other than a gap showed the index wrong (a probe missed a block it holds)."""
        self.gaps += 1
        self.complete = False

    def apply(self, seq: int, events: Iterable[Mapping[str, Any]]) -> None:
        """Fold batch `seq`'s events in (the caller has checked `accept`, or called `lose`)."""
        self.last_seq = seq
        for event in events:
            kind = event.get("type")
            if kind == "BlockStored":
                self._stored(event)
            elif kind == "BlockRemoved":
                if event.get("medium") in _CACHED_MEDIA and event.get("group_idx") in (None, 0):
                    for block_hash in event.get("block_hashes") or ():
                        self._remove(block_hash, seq)
            elif kind == "AllBlocksCleared":
                self._block.clear()
                self._key_of.clear()
                self._removed.clear()
                self.complete = True
                self.clears += 1

    def holds(self, chain: BlockChain) -> bool:
        """Whether every block of `chain` is stored (an empty chain is held trivially)."""
        parent: Hashable = None
        extra = chain.first_extra
        for digest in chain.digests:
            found = self._block.get((parent, digest, extra))
            if found is None:
                return False
            parent, extra = found, None
        return True

    def removed_since(self, chain: BlockChain, seq: int) -> bool:
        """Whether a block of `chain` was removed by a batch after `seq`, walking from the root through
        blocks held or remembered removed (a block never seen ends the walk: nothing to tell)."""
        parent: Hashable = None
        extra = chain.first_extra
        for digest in chain.digests:
            key = (parent, digest, extra)
            found = self._block.get(key)
            if found is None:
                gone = self._removed.get(key)
                if gone is None:
                    return False
                found, removed_by = gone
                if removed_by > seq:
                    return True
            parent, extra = found, None
        return False

    def _stored(self, event: Mapping[str, Any]) -> None:
        if event.get("medium") not in _CACHED_MEDIA or event.get("group_idx") not in (None, 0):
            return
        hashes = event.get("block_hashes") or []
        tokens = event.get("token_ids") or []
        size = event.get("block_size")
        extras = event.get("extra_keys") or [None] * len(hashes)
        if not isinstance(size, int) or size < 1 or len(tokens) < len(hashes) * size:
            return  # not a shape this index understands: leave it out rather than guess
        parent = event.get("parent_block_hash")
        for index, block_hash in enumerate(hashes):
            if not isinstance(block_hash, Hashable):
                return
            extra = _extra(extras[index]) if index < len(extras) else None
            key = (parent, _digest(tokens[index * size : (index + 1) * size]), extra)
            self._forget(block_hash)
            self._removed.pop(key, None)
            self._block[key] = block_hash
            self._key_of[block_hash] = key
            parent = block_hash

    def _forget(self, block_hash: Hashable) -> BlockKey | None:
        """Drop `block_hash`; its key if the index held it."""
        key = self._key_of.pop(block_hash, None)
        if key is not None and self._block.get(key) == block_hash:
            del self._block[key]
            return key
        return None

    def _remove(self, block_hash: Hashable, seq: int) -> None:
        key = self._forget(block_hash)
        if key is None:
            return
        self._removed.pop(key, None)  # re-inserted last: the dict stays oldest first
        self._removed[key] = (block_hash, seq)
        if len(self._removed) > self.removals_kept:
            del self._removed[next(iter(self._removed))]
