"""The per-layer KV cache, with a provenance map that says where every entry came from.

``k[l, b, :, c]`` and ``v[l, b, :, c]`` hold layer ``l``'s key and value for column ``c`` of sequence
``b``. Beside them, ``state[l, b, c]`` is one of:

=============  =====================================================================
``HOLE``       never written: the token at ``c`` exited below layer ``l`` (or was skipped)
``COMPUTED``   written by the token's own forward pass through layer ``l``
``COPIED``     written by copy-forward (CALM state propagation) from a lower layer's state
``RECOMPUTED`` written later by running the skipped layer for the token (lazy / eager)
``PAD``        left padding of a batched prompt: not a token, never attended
=============  =====================================================================

The buffers are preallocated (zeros), so a hole that an unchecked implementation reads holds
exactly what the allocation left there: K = V = 0.
"""
from __future__ import annotations

import torch

HOLE, COMPUTED, COPIED, RECOMPUTED, PAD = 0, 1, 2, 3, 4
STATE_NAMES = {HOLE: "hole", COMPUTED: "computed", COPIED: "copied", RECOMPUTED: "recomputed", PAD: "pad"}


class KVCache:
    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, head_dim: int, max_len: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (num_layers, batch, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.state = torch.full((num_layers, batch, max_len), HOLE, dtype=torch.uint8, device=device)
        self.num_layers, self.batch, self.max_len = num_layers, batch, max_len
        # Python-side flag per layer: True while the layer may hold a hole or a pad below `length`,
        # so the decoder knows when it must build an attention mask at all.
        self.maybe_masked = [False] * num_layers

    @property
    def nbytes(self) -> int:
        """Bytes of the K and V buffers (the provenance map is bookkeeping, not cache)."""
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def write(self, layer: int, rows, cols, k: torch.Tensor, v: torch.Tensor, state: int) -> None:
        """Write ``k, v`` of shape (b, H_kv, S, d) at ``rows`` (slice or index tensor) and ``cols``.

        ``cols`` is an int (one column for every row) or a LongTensor (S,) shared by the rows.
        """
        if isinstance(cols, int):
            self.k[layer, rows, :, cols] = k[:, :, 0]
            self.v[layer, rows, :, cols] = v[:, :, 0]
            self.state[layer, rows, cols] = state
        else:
            if isinstance(rows, slice):
                self.k[layer, rows, :, cols] = k
                self.v[layer, rows, :, cols] = v
                self.state[layer, rows, cols] = state
            else:  # one row at a time keeps advanced indexing simple and the shapes explicit
                for i, r in enumerate(rows.tolist()):
                    self.k[layer, r, :, cols] = k[i]
                    self.v[layer, r, :, cols] = v[i]
                    self.state[layer, r, cols] = state

    def leave_hole(self, layers: range, rows, col: int) -> None:
        """Mark (layer, row, col) as a hole: the state says so and the buffer holds zeros."""
        for l in layers:
            self.k[l, rows, :, col] = 0
            self.v[l, rows, :, col] = 0
            self.state[l, rows, col] = HOLE
            self.maybe_masked[l] = True

    def truncate(self, length: int) -> None:
        """Forget every column from ``length`` on (speculative decoding's rollback)."""
        self.k[:, :, :, length:] = 0
        self.v[:, :, :, length:] = 0
        self.state[:, :, length:] = HOLE

    def holes(self, length: int) -> torch.Tensor:
        """Boolean (L, B, length): where the cache has a hole."""
        return self.state[:, :, :length] == HOLE
