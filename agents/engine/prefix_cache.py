"""Prefix cache: keys/values of finished requests, reused by requests that extend them.

An agent resends its whole conversation every turn: turn n+1's input is turn n's input,
its output and the new observation. Without reuse each turn prefills the whole history
again. Finished requests' keys/values are kept here (LRU, bounded by
`prefix_cache_tokens`), indexed by a chained hash at every `block_tokens` boundary, so
a lookup is one pass over the new input plus one exact comparison of the match.

Entries are only valid for the weights that computed them: the engine clears the cache
when it swaps weights and on /flush_cache. Only the scheduler thread touches it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from trainer.model import KVCache


@dataclass(eq=False)
class CachedPrefix:
    tokens: list[int]
    full_hash: int
    keys: list[torch.Tensor]  # per layer: (kv_heads, len(tokens), head_dim)
    values: list[torch.Tensor]


def block_hashes(tokens: list[int], block: int, limit: int) -> list[int]:
    """Chained hashes of tokens[:block], tokens[:2*block], ... up to `limit` tokens."""
    hashes: list[int] = []
    running = 0
    for end in range(block, limit + 1, block):
        running = hash((running, *tokens[end - block : end]))
        hashes.append(running)
    return hashes


class PrefixCache:
    def __init__(self, capacity_tokens: int, block_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        self.block = block_tokens
        self._entries: OrderedDict[int, CachedPrefix] = OrderedDict()  # full hash → entry, LRU order
        self._boundaries: dict[int, CachedPrefix] = {}  # hash at any block boundary → entry
        self.tokens = 0
        self.hits = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def insert(self, tokens: list[int], cache: KVCache, length: int) -> None:
        """Keep the first `length` positions of `cache` (row 0), rounded down to a block boundary."""
        usable = (min(length, len(tokens)) // self.block) * self.block
        if self.capacity_tokens <= 0 or usable == 0 or usable > self.capacity_tokens:
            return
        hashes = block_hashes(tokens, self.block, usable)
        if hashes[-1] in self._entries:
            self._entries.move_to_end(hashes[-1])
            return
        entry = CachedPrefix(
            tokens=list(tokens[:usable]),
            full_hash=hashes[-1],
            keys=[k[0, :, :usable].clone() for k in cache.keys],
            values=[v[0, :, :usable].clone() for v in cache.values],
        )
        for boundary in hashes[:-1]:  # an entry that is a prefix of this one is now redundant
            shorter = self._entries.get(boundary)
            if shorter is not None:
                self._remove(boundary, shorter)
        self._entries[hashes[-1]] = entry
        self._boundaries.update(dict.fromkeys(hashes, entry))
        self.tokens += usable
        while self.tokens > self.capacity_tokens:
            oldest_hash, oldest = next(iter(self._entries.items()))
            self._remove(oldest_hash, oldest)

    def lookup(self, tokens: list[int]) -> tuple[CachedPrefix, int] | None:
        """The longest cached block-aligned prefix of `tokens` that leaves at least one token to
        prefill (its logits start generation): (entry, matched length), or None."""
        if not self._entries:
            return None
        hashes = block_hashes(tokens, self.block, len(tokens) - 1)
        for index in range(len(hashes) - 1, -1, -1):
            entry = self._boundaries.get(hashes[index])
            matched = (index + 1) * self.block
            if entry is not None and entry.tokens[:matched] == tokens[:matched]:
                self._entries.move_to_end(entry.full_hash)
                self.hits += 1
                self.hit_tokens += matched
                return entry, matched
        return None

    def clear(self) -> None:
        self._entries.clear()
        self._boundaries.clear()
        self.tokens = 0

    def _remove(self, full_hash: int, entry: CachedPrefix) -> None:
        del self._entries[full_hash]
        self.tokens -= len(entry.tokens)
        for boundary in block_hashes(entry.tokens, self.block, len(entry.tokens)):
            if self._boundaries.get(boundary) is entry:
                del self._boundaries[boundary]
