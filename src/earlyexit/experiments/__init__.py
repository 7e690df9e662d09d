"""What the book's chapters compute, built on the engine and training, cached in the result store.

Modules: ``evalset`` (the evaluation prompt sets), ``points`` (one decoding configuration measured on a prompt
set), ``metrics`` (quality against a reference, intervals), ``probes`` (what the cache holds and attention does
with it), ``drift`` (how far a method's cache is from the exact one), ``timing`` (wall-clock speed), ``costmodel``
(unit costs, and a run's calls turned into time), ``costs`` (FLOP and time breakdowns of measured points),
``frontier`` (what exit rules can buy with an exact cache), ``budget`` (what training buys self-speculation),
``classify`` (the exit classifier's quality), ``decisions`` (deciding with or without the head), ``trained``
(the trained models' tables) and ``compare`` (every method side by side).

Nothing here imports the build tooling (:mod:`earlyexit.book`): an experiment takes its parameters as
arguments, so that its cached results are keyed by the experiment's own code.
"""
