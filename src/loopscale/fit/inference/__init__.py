"""What a fitted law lets one claim, and how sure: intervals, tests, held-out checks, verdicts.

``profile``: phi's and Delta-phi's profile-likelihood intervals and tests, calibrated by a wild cluster
bootstrap (docs/fit.md, "Inference"); ``bootstrap``: the paper's block bootstrap over (budget, r) cells
(secondary intervals); ``shared``: Delta-phi under one shared law, and the loss gap on the same runs;
``checks``: extrapolation, leave-one-r-out, half split; ``compare``: a fit against the paper or another
fit; ``verdict``: "resolved" or "not resolved, because ...", the one verdict every command prints.
"""
