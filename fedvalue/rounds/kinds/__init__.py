"""The kinds of round book, one module each (top-k marks, TracIn flows, fairness, curvature
fairness, claim flags, defences, value weighting, the fixed-weight game's second-order expansion),
and their registry (:mod:`.registry`): a new kind is one module and one
line there."""
