"""KV caches for the HF generator: per-session caches (LRU-bounded) and the running batch's padded cache.

A session's cache holds the keys/values of exactly the tokens in ``SessionKV.token_ids`` (the previous
turn's prompt and completion). The running batch keeps every row left-padded to a common length inside
one ``transformers.DynamicCache``, so one forward pass decodes all rows; pad columns are masked out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

LayerKV = tuple[torch.Tensor, torch.Tensor]


@dataclass
class SessionKV:
    """Keys/values (per layer, ``[1, kv_heads, len, head_dim]``) of ``token_ids``."""

    token_ids: list[int]
    layers: list[LayerKV]

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.layers)

    def reusable_prefix(self, prompt_ids: Sequence[int]) -> int:
        """How many leading prompt tokens this cache covers; at least one prompt token is always left to prefill."""
        limit = min(len(self.token_ids), len(prompt_ids) - 1)
        n = 0
        while n < limit and self.token_ids[n] == prompt_ids[n]:
            n += 1
        return n

    def cropped(self, length: int) -> SessionKV:
        if length == len(self.token_ids):
            return self
        return SessionKV(
            self.token_ids[:length], [(k[:, :, :length], v[:, :, :length]) for k, v in self.layers]
        )


@dataclass
class SessionStoreStats:
    evictions: int = 0
    releases: int = 0
    invalidations: int = 0


@dataclass
class SessionCacheStore:
    """LRU store of idle sessions' caches, bounded by a session count and a byte budget.

    A session in use is taken out of the store (``take``) and put back when its request ends, so the
    bounds apply to idle caches and eviction never touches a running request.
    """

    max_sessions: int
    max_bytes: int
    stats: SessionStoreStats = field(default_factory=SessionStoreStats)
    _entries: OrderedDict[str, SessionKV] = field(default_factory=OrderedDict)
    _bytes: int = 0

    def take(self, session_id: str) -> SessionKV | None:
        entry = self._entries.pop(session_id, None)
        if entry is not None:
            self._bytes -= entry.nbytes
        return entry

    def put(self, session_id: str, entry: SessionKV) -> None:
        self.take(session_id)
        if entry.nbytes > self.max_bytes or self.max_sessions <= 0:
            self.stats.evictions += 1
            return
        self._entries[session_id] = entry
        self._bytes += entry.nbytes
        while len(self._entries) > self.max_sessions or self._bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.nbytes
            self.stats.evictions += 1

    def release(self, session_id: str) -> bool:
        released = self.take(session_id) is not None
        self.stats.releases += int(released)
        return released

    def clear(self) -> None:
        self.stats.invalidations += len(self._entries)
        self._entries.clear()
        self._bytes = 0

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def session_ids(self) -> list[str]:
        """Idle sessions, least recently used first."""
        return list(self._entries)


class BatchKV:
    """The running batch's cache: rows left-padded to one length in a ``DynamicCache``."""

    def __init__(self) -> None:
        from transformers import DynamicCache

        self._cache_cls = DynamicCache
        self.cache = None
        self.pads: list[int] = []

    @property
    def width(self) -> int:
        """Padded length of every row."""
        return 0 if self.cache is None else self.cache.layers[0].keys.shape[-2]

    def __len__(self) -> int:
        return len(self.pads)

    def join(self, rows: Sequence[list[LayerKV]]) -> None:
        """Append rows (each a per-layer list of ``[1, h, len, d]`` keys/values) to the batch."""
        if not rows:
            return
        lengths = [row[0][0].shape[-2] for row in rows]
        width = max([self.width, *lengths])
        layers = []
        num_layers = len(rows[0])
        for layer in range(num_layers):
            keys, values = [], []
            if self.cache is not None:
                old = self.cache.layers[layer]
                keys.append(_left_pad(old.keys, width))
                values.append(_left_pad(old.values, width))
            for row in rows:
                keys.append(_left_pad(row[layer][0], width))
                values.append(_left_pad(row[layer][1], width))
            layers.append((torch.cat(keys), torch.cat(values)))
        old_width = self.width
        self.pads = [p + width - old_width for p in self.pads] + [width - n for n in lengths]
        self.cache = self._cache_cls(layers)

    def select(self, keep: Sequence[int]) -> None:
        """Keep only rows ``keep`` (in that order) and trim padding columns no row needs any more."""
        if not keep:
            self.cache, self.pads = None, []
            return
        pads = [self.pads[i] for i in keep]
        trim = min(pads)
        index = torch.tensor(list(keep), device=self.cache.layers[0].keys.device)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, trim:]
            layer.values = layer.values.index_select(0, index)[:, :, trim:]
        self.pads = [p - trim for p in pads]

    def extract(self, row: int) -> list[LayerKV]:
        """A standalone copy of one row's keys/values without its padding."""
        pad = self.pads[row]
        return [
            (layer.keys[row : row + 1, :, pad:].clone(), layer.values[row : row + 1, :, pad:].clone())
            for layer in self.cache.layers
        ]

    def attention_mask(self, extra: int = 1) -> torch.Tensor:
        """``[rows, width + extra]`` mask: 0 on each row's padding, 1 on its tokens and the ``extra`` new ones."""
        device = self.cache.layers[0].keys.device
        mask = torch.ones(len(self.pads), self.width + extra, dtype=torch.long, device=device)
        for row, pad in enumerate(self.pads):
            mask[row, :pad] = 0
        return mask


def _left_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - tensor.shape[-2]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[-2] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=-2)
