"""Group fairness scored with torch: the relaxed gaps and their objective (:mod:`.objectives`),
influence with curvature ([FAIRIJ] Eq. 6: :mod:`.curvature`), the kernelized constraint
influence ([FAIRINFL]: :mod:`.ntk`) and reweighting ([FAIRIJ] Props. 3.1-3.3: :mod:`.reweighting`)."""
