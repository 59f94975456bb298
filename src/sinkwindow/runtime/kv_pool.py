"""A pool of fixed-size KV blocks, allocated once, that every request and session draws from.

The pool is two tensors made at start, ``keys`` and ``values`` ``[num_blocks, block, kv_heads,
head_dim]`` (token-major, so ``flat_keys [num_blocks * block, kv_heads, head_dim]`` is a view and one
``index_select`` gathers a row's slots), shared by all layers: a block holds ``block`` tokens of one layer of one sequence. A
sequence (``PoolRow``) owns, per layer, a list of block ids (its block table); under SWA(w, s) a
layer needs ``ceil(min(tokens, w) / block)`` blocks, so a one-token sequence holds one block per
layer and a long one ``ceil(w / block)``, never more (``paged_cache`` recycles them as a ring). A
full-attention layer's table grows by one block every ``block`` tokens.

Memory is bounded by construction: nothing here allocates KV memory after ``__init__``; blocks go
back to the free list explicitly (``release``), never through the garbage collector. Admission is
by reservation: ``reserve`` promises a row the blocks its request can reach (or says it cannot),
so a running forward never finds the pool empty. Block 0 is a scratch block no row owns: padded
table entries point at it and writes of tokens that do not survive a chunk land there.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

import torch

__all__ = ["KVPool", "PoolRow", "PoolFullError", "block_bytes"]


class PoolFullError(RuntimeError):
    """The pool cannot hold a request now (``later=True``) or ever (``later=False``)."""

    def __init__(self, message: str, later: bool):
        super().__init__(message)
        self.later = later


def block_bytes(kv_heads: int, head_dim: int, block: int, dtype: torch.dtype) -> int:
    """Bytes of one block: its keys and values (``2 * kv_heads * block * head_dim`` elements)."""
    return 2 * kv_heads * block * head_dim * torch.empty((), dtype=dtype).element_size()


@dataclass(eq=False)
class PoolRow:
    """One sequence's blocks: ``tables[layer]`` lists its block ids in logical order.

    ``seen`` counts the real tokens the sequence has written (its next position); ``ticket`` the
    blocks reserved for it and not drawn yet. ``table`` is ``[layers, capacity]`` (long) mirroring
    ``tables`` for the gathers, rebuilt only when a block is added.
    """

    layers: int
    block_bytes: int = 0
    seen: int = 0
    ticket: int = 0
    tables: list[list[int]] = field(default_factory=list)
    _table: torch.Tensor | None = None

    def __post_init__(self):
        if not self.tables:
            self.tables = [[] for _ in range(self.layers)]

    @property
    def blocks(self) -> int:
        return sum(len(t) for t in self.tables)

    @property
    def nbytes(self) -> int:
        """Bytes of the pool blocks it holds."""
        return self.blocks * self.block_bytes

    def table(self, device) -> torch.Tensor:
        """``[layers, max blocks of a layer]`` block ids (0, the scratch block, past a layer's own)."""
        width = max((len(t) for t in self.tables), default=0)
        if self._table is None or self._table.shape[1] != width or self._table.device != torch.device(device):
            rows = [t + [0] * (width - len(t)) for t in self.tables]
            self._table = torch.tensor(rows, dtype=torch.long, device=device).reshape(self.layers, width)
        return self._table


class KVPool:
    """``num_blocks`` blocks of ``block`` tokens (keys and values of one layer), allocated once.

    Args:
        num_blocks: blocks in the pool (block 0, the scratch block, is one of them and never handed out).
        layers, kv_heads, head_dim: of the model's attention layers (every layer alike).
        block: tokens per block.
        dtype, device: of the tensors.
    """

    def __init__(self, num_blocks: int, *, layers: int, kv_heads: int, head_dim: int, block: int = 16,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):  # fmt: skip
        if num_blocks < 2 or block < 1:
            raise ValueError(
                f"a pool needs at least 2 blocks of at least 1 token, got {num_blocks} of {block}"
            )
        self.layers, self.kv_heads, self.head_dim, self.block = layers, kv_heads, head_dim, block
        self.num_blocks = num_blocks
        # Zeros, not empty: the pages are touched now (the memory is really taken at start), and padded
        # gathers of never-written slots read finite numbers (a masked NaN would still poison SDPA).
        self.keys = torch.zeros((num_blocks, block, kv_heads, head_dim), dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.flat_keys = self.keys.view(num_blocks * block, kv_heads, head_dim)
        self.flat_values = self.values.view(num_blocks * block, kv_heads, head_dim)
        self.block_bytes = block_bytes(kv_heads, head_dim, block, dtype)
        self._free = list(range(num_blocks - 1, 0, -1))  # pop() hands out low ids first
        self.reserved = 0
        self._lock = threading.Lock()

    @property
    def usable(self) -> int:
        return self.num_blocks - 1

    @property
    def used(self) -> int:
        return self.usable - len(self._free)

    @property
    def available(self) -> int:
        """Blocks neither held nor promised."""
        return len(self._free) - self.reserved

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.block_bytes

    def blocks_for(self, tokens: int, windows: list[int | None]) -> int:
        """Blocks a sequence of ``tokens`` holds, summed over layers of these windows (``None``: full)."""
        return sum(math.ceil(min(tokens, w if w is not None else tokens) / self.block) for w in windows)

    def new_row(self) -> PoolRow:
        return PoolRow(self.layers, self.block_bytes)

    def reserve(self, row: PoolRow, blocks: int) -> None:
        """Promise ``row`` ``blocks`` more blocks (on top of what it holds and was promised).

        Raises:
            PoolFullError: not that many are available now (``later``: the pool could hold them).
        """
        with self._lock:
            if blocks <= row.ticket:
                return
            extra = blocks - row.ticket
            if extra > self.available:
                later = row.blocks + blocks <= self.usable
                raise PoolFullError(
                    f"the KV pool has {self.available} of {self.usable} blocks free, the request needs {extra} more",
                    later,
                )
            self.reserved += extra
            row.ticket += extra

    def grow(self, row: PoolRow, layer: int, blocks: int) -> None:
        """Give ``row``'s ``layer`` blocks until it holds ``blocks`` (drawn from its ticket first)."""
        table = row.tables[layer]
        if len(table) >= blocks:
            return
        with self._lock:
            while len(table) < blocks:
                if row.ticket > 0:
                    row.ticket -= 1
                    self.reserved -= 1
                elif self.available <= 0:
                    raise PoolFullError(f"the KV pool's {self.usable} blocks are all held or promised", True)
                table.append(self._free.pop())
        row._table = None

    def release(self, row: PoolRow) -> int:
        """Return every block of ``row`` (and its unused promise) to the pool; the blocks freed."""
        with self._lock:
            freed = row.blocks
            for table in row.tables:
                self._free.extend(reversed(table))
                table.clear()
            self.reserved -= row.ticket
            row.ticket, row.seen, row._table = 0, 0, None
            return freed

    def unpromise(self, row: PoolRow) -> None:
        """Drop what is left of ``row``'s promise (its request ended); the blocks it holds stay."""
        with self._lock:
            self.reserved -= row.ticket
            row.ticket = 0

    def stats(self) -> dict:
        with self._lock:
            used, free = self.used, len(self._free)
            return {
                "pool_block_tokens": self.block,
                "pool_blocks": self.usable,
                "pool_blocks_used": used,
                "pool_blocks_free": free,
                "pool_blocks_reserved": self.reserved,
                "pool_bytes": self.usable * self.block_bytes,
                "pool_bytes_used": used * self.block_bytes,
                "pool_bytes_free": free * self.block_bytes,
            }
