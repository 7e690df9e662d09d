"""What each chapter's page shows, built from the experiments' results: one module a chapter (``chNN``) with its
figures, its tables as a reader sees them, and the sentences whose wording depends on a result (each tested
branch by branch, so that no page prints "0 threshold(s)" or a clause twice).

A notebook holds the narrative, its parameters and calls into these; it computes nothing the store keeps (the
experiments do, in :mod:`earlyexit.experiments`), so editing a page's code recomputes no result.
"""
