"""Small helpers shared by the tests (imported as ``from helpers import ...``)."""
from earlyexit.engine import DecodeConfig, decode


def gen(model, prompts, max_new_tokens, rule="full", strategy="naive-mask", rule_kw=None, **kw):
    """``decode`` with an early-exit configuration given as (rule, strategy, rule arguments)."""
    return decode(model, prompts, DecodeConfig.early_exit(rule, strategy, **(rule_kw or {})), max_new_tokens, **kw)


def spec(model, ids, n, E, d, **kw):
    """Self-speculative decoding of one prompt through the front door."""
    return decode(model, [ids], DecodeConfig.self_speculation(E, d), n, **kw)
