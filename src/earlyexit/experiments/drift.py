"""How far a method's cache is from the true one: the full model's own cache over the same tokens, the
drift of the next-token distribution along a teacher-forced run, and the audit of lazy recompute."""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..engine.cache import COMPUTED, COPIED, HOLE, RECOMPUTED
from ..engine import DecodeConfig, Result, decode
from ..engine.adapter import unwrap
from . import metrics
from .. import store
from ..store import workers
from .points import point_params
from .evalset import EvalSet


@torch.inference_mode()
def true_cache(lm, seq: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V (L, H_kv, T, d) of the full model over ``seq``: the cache the invariant asks for."""
    model = unwrap(lm)
    x = torch.tensor([seq], device=next(model.parameters()).device)
    pkv = model(x, attention_mask=torch.ones_like(x), use_cache=True).past_key_values
    k = torch.stack([layer.keys[0] for layer in pkv.layers]).float().cpu()
    v = torch.stack([layer.values[0] for layer in pkv.layers]).float().cpu()
    return k, v


def drift(lm, prompt_ids: list[int], tr: Result, b: int, full_logits: torch.Tensor,
          full_tokens: list[int]) -> pd.DataFrame:
    """Per generated position t of row ``b`` of a run teacher-forced on ``full_tokens`` (decoded with
    ``return_kv=True``):

    kl        KL(full ‖ method) of the next-token distribution (nats)
    exit      the step's exit layer
    k_err_*   relative error ||K − K*|| / ||K*|| of the cache entries at this token's column against
              the full model's own cache over the same tokens, averaged over the layers whose entry is
              computed / copied (NaN where none)
    v_err_*   the same for V
    copies_seen  copied entries (layer, column) a step at this position can attend to
    """
    n = len(full_tokens)
    pad = int(tr.pad[b])
    lp = len(prompt_ids)
    seq = list(prompt_ids) + list(full_tokens[: n - 1])
    kt, vt = true_cache(lm, seq)                                     # (L, Hkv, T, d)
    T = len(seq)
    km = tr.kv[0][:, b, :, pad: pad + T].float()                     # (L, Hkv, T, d)
    vm = tr.kv[1][:, b, :, pad: pad + T].float()
    st = tr.state[:, b, pad: pad + T]                                # (L, T)

    def rel(a, ref):
        return ((a - ref).norm(dim=(1, 3)) / ref.norm(dim=(1, 3)).clamp_min(1e-12)).numpy()   # (L, T)

    ek, ev = rel(km, kt), rel(vm, vt)
    kl = metrics.kl_divergence(full_logits[b, :n], tr.logits[b, :n])
    copies = np.cumsum((st == COPIED).sum(0).numpy())
    rows = []
    for t in range(n):
        col = lp + t - 1            # the column of the input that predicted token t (t >= 1)
        row = {"prompt": b, "t": t, "kl": float(kl[t]), "exit": int(tr.exit_layer[b, t])}
        if t >= 1 and col < T:
            s = st[:, col].numpy()
            for name, code in (("computed", COMPUTED), ("copied", COPIED)):
                sel = np.isin(s, (code, RECOMPUTED)) if code == COMPUTED else s == code
                row[f"k_err_{name}"] = float(ek[sel, col].mean()) if sel.any() else float("nan")
                row[f"v_err_{name}"] = float(ev[sel, col].mean()) if sel.any() else float("nan")
            row["copies_seen"] = int(copies[col])
        else:
            row.update(k_err_computed=float("nan"), v_err_computed=float("nan"), k_err_copied=float("nan"),
                       v_err_copied=float("nan"), copies_seen=0)
        rows.append(row)
    return pd.DataFrame(rows)


def drift_point(lm, es: EvalSet, n_new: int, configs) -> pd.DataFrame:
    """:func:`drift` for every prompt and DecodeConfig, teacher-forced on the full model's own continuation
    (generated with ``stop_at_eos=False``, so every position exists for every method). Cached per config."""
    def full_run():
        return decode(lm, es.ids, DecodeConfig.full(), n_new, stop_at_eos=False, return_logits=True)

    holder = {}

    def one(cfg):
        def compute():
            if "full" not in holder:
                holder["full"] = full_run()
            fr = holder["full"]
            force = fr.tokens.clone()
            tr = decode(lm, es.ids, cfg, n_new, force=force, return_logits=True, return_kv=True,
                        stop_at_eos=False)
            frames = [drift(lm, es.ids[b], tr, b, fr.logits, fr.tokens[b].tolist()) for b in range(len(es))]
            df = pd.concat(frames, ignore_index=True)
            df.insert(0, "label", cfg.label)
            df.insert(1, "strategy", cfg.strategy)
            return df

        return store.cached("drift", point_params(es, n_new, cfg), compute, model=lm)

    return pd.concat(workers.each(configs, one), ignore_index=True)  # sharded in a distributed sweep


def lazy_audit(lm, ids: list[int], n_new: int, rule: str, **rule_kw) -> dict:
    """Decode one prompt with lazy recompute, complete the pending recomputes (``flush``) and compare
    the whole cache with the full model's own cache over the same tokens.

    Returns the entries pending before the flush, the holes left after it, the recomputed entries,
    and the largest absolute difference of K and V from the full model's cache.
    """
    cfg = DecodeConfig.early_exit(rule, "lazy-recompute", **rule_kw)
    tr = decode(lm, [ids], cfg, n_new, stop_at_eos=False, flush=True, return_kv=True)
    n = int(tr.n_new[0])
    pad = int(tr.pad[0])
    T = len(ids) + n - 1
    before = tr.state[:, 0, pad: pad + T]
    after = tr.flushed_state[:, 0, pad: pad + T]
    seq = list(ids) + tr.tokens[0, : n - 1].tolist()
    kt, vt = true_cache(lm, seq)
    km = tr.kv[0][:, 0, :, pad: pad + T].float()
    vm = tr.kv[1][:, 0, :, pad: pad + T].float()
    return {"pending_before_flush": int((before == HOLE).sum()), "holes_after_flush": int((after == HOLE).sum()),
            "recomputed_entries": int((after == RECOMPUTED).sum()), "entries": int(after.numel()),
            "max_abs_k": float((km - kt).abs().max()), "max_abs_v": float((vm - vt).abs().max()),
            "max_abs_ref": float(kt.abs().max())}

