"""The result store: each computed point kept on disk once, keyed by what it depends on.

    from earlyexit import store
    df = store.cached("exit_rate", {"threshold": 0.9}, compute, model=lm)

Modules: ``results`` (the cache: entries, sweeps, reading back), ``codekey`` (which of the package's code a
result depends on, and its hash), ``claims`` (lock files, so that of several processes one computes an entry
and the others wait) and ``workers`` (sharding a sweep's points over processes).
"""
from .results import (CorruptEntry, ResourceError, cached, clear, entries, entry_key, has, read,  # noqa: F401
                      sweep, weights_id)
