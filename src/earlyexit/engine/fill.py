"""What happens above the exit: the five ways of handling the K/V a token never wrote.

Each strategy is a small class; :class:`Strategy` declares every hook the decoding loop calls, each
with a do-nothing default:

* ``reset(eng)``: a new decoding run starts on ``eng`` (its cache is empty).
* ``on_exit(eng, rows, n, h, col, pos)``: the current tokens of ``rows`` exited after ``n`` layers
  with hidden state ``h`` (b, 1, D) at cache column ``col`` and RoPE positions ``pos`` (b, 1).
  The default leaves the hole: layers ``n..L-1`` of that column are marked HOLE.
* ``before_layer(eng, l, rows)``: the current tokens of ``rows`` are about to run layer ``l`` (0-based);
  returns extra tokens to run in the same batch, ``{row: (cols, hidden (1, S, D), pos (1, S))}``, or None.
* ``after_layer(eng, l, row, cols, h_new)``: those extra tokens of ``row`` ran layer ``l``; ``h_new``
  (1, S, D) are their new hidden states.
* ``pending(row)``: cache entries (layer, column) of ``row`` still owed by deferred work.
* ``flush(eng)``: do the deferred work now (an audit of the cache; not part of decoding cost).

``naive-mask``       leave the hole; later tokens' softmax renormalizes over the keys that exist.
``naive-undefined``  leave the hole and read it anyway: K = V = 0 from allocation, as an unchecked
                     implementation would (the hole takes softmax mass and contributes nothing).
``copy-forward``     CALM's state propagation: for every skipped layer j, K^j, V^j come from layer j's
                     own input norm and W_K^j, W_V^j (RoPE at the token's position) applied to the exit
                     hidden state. Only K/V are written; nothing above the exit runs.
``lazy-recompute``   leave the hole; when a later token needs layer j, run layer j for every pending
                     exited token in ONE batch with that token (FREE, Bae et al. 2023; EE-LLM, Chen et
                     al. 2023). Exact by construction.
``eager-recompute``  run the remaining layers right after the exit, for K/V only (CALM's oracle cache).
"""
from __future__ import annotations

import torch

from .cache import COPIED, RECOMPUTED

STRATEGIES = ("naive-mask", "naive-undefined", "copy-forward", "lazy-recompute", "eager-recompute")


class Strategy:
    name = "strategy"
    reads_holes = False  # True: the attention mask lets holes through

    def reset(self, eng) -> None:
        pass

    def on_exit(self, eng, rows: torch.Tensor, n: int, h, col: int, pos) -> None:
        eng.cache.leave_hole(range(n, eng.L), rows, col)

    def before_layer(self, eng, l: int, rows: torch.Tensor):
        return None

    def after_layer(self, eng, l: int, row: int, cols: list[int], h_new: torch.Tensor) -> None:
        pass

    def pending(self, row: int) -> int:
        return 0

    def flush(self, eng) -> None:
        pass


class NaiveMask(Strategy):
    name = "naive-mask"


class NaiveUndefined(Strategy):
    name = "naive-undefined"
    reads_holes = True


class CopyForward(Strategy):
    name = "copy-forward"

    def on_exit(self, eng, rows, n, h, col, pos):
        cos, sin = eng.A.rope(h, pos)
        for j in range(n, eng.L):
            eng.tally(f"kv:{h.shape[0]}")
            _, k, v = eng.A.qkv(j, h, cos, sin, with_q=False)
            eng.cache.write(j, rows, col, k, v, COPIED)
        eng.count(rows, "copied_kv", eng.L - n)


class EagerRecompute(Strategy):
    name = "eager-recompute"

    def on_exit(self, eng, rows, n, h, col, pos):
        cos, sin = eng.A.rope(h, pos)
        for j in range(n, eng.L):
            h = eng.layer(j, h, rows, col, cos, sin, RECOMPUTED)
        eng.count(rows, "recompute_layers", eng.L - n)


class LazyRecompute(Strategy):
    """Pending tokens wait, each at the level (number of layers run) it reached.

    Invariant: when the current token is about to run layer ``l``, every pending token of its row
    has level >= l. Those at exactly ``l`` run layer ``l`` in the same batch as the current token,
    so every key the batch attends to exists and is exact.
    """

    name = "lazy-recompute"

    def reset(self, eng):
        # per row: {col: (level, hidden (1, D), pos)}
        self.pending_tokens: list[dict[int, list]] = [dict() for _ in range(eng.B)]
        self._L = eng.L

    def on_exit(self, eng, rows, n, h, col, pos):
        super().on_exit(eng, rows, n, h, col, pos)
        for i, r in enumerate(rows.tolist()):
            self.pending_tokens[r][col] = [n, h[i], pos[i]]

    def before_layer(self, eng, l, rows):
        """The pending tokens of each row that sit at level ``l``: (cols, hidden, pos) per row."""
        out = {}
        for r in rows.tolist():
            due = sorted(c for c, (lev, _, _) in self.pending_tokens[r].items() if lev == l)
            if due:
                hs = torch.cat([self.pending_tokens[r][c][1] for c in due], dim=0)[None]  # (1, S, D)
                ps = torch.cat([self.pending_tokens[r][c][2] for c in due], dim=0)[None]  # (1, S)
                out[r] = (due, hs, ps)
        return out or None

    def after_layer(self, eng, l, r, due, h_new):
        """Store the advanced hidden states; drop tokens that now have every layer."""
        for i, c in enumerate(due):
            if l + 1 >= eng.L:
                del self.pending_tokens[r][c]
            else:
                self.pending_tokens[r][c] = [l + 1, h_new[0, i:i + 1], self.pending_tokens[r][c][2]]

    def pending(self, row: int) -> int:
        """Layer entries of ``row`` that pending tokens have not written yet."""
        return sum(self._L - lev for lev, _, _ in self.pending_tokens[row].values())

    @torch.inference_mode()
    def flush(self, eng):
        """Run every pending token to the top (used to audit the cache; not part of decoding cost)."""
        for r in range(eng.B):
            while self.pending_tokens[r]:
                l = min(lev for lev, _, _ in self.pending_tokens[r].values())
                due = self.before_layer(eng, l, torch.tensor([r]))[r]
                cols, hs, ps = due
                cos, sin = eng.A.rope(hs, ps)
                h_new = eng.layer(l, hs, torch.tensor([r]), torch.tensor(cols), cos, sin, RECOMPUTED)
                self.after_layer(eng, l, r, cols, h_new)


REGISTRY = {cls.name: cls for cls in (NaiveMask, NaiveUndefined, CopyForward, LazyRecompute, EagerRecompute)}


def make_strategy(name: str) -> Strategy:
    if name not in REGISTRY:
        raise ValueError(f"unknown fill strategy {name!r}; valid: {', '.join(STRATEGIES)}")
    return REGISTRY[name]()
