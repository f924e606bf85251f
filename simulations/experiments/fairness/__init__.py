"""Fair books in federated rounds (:mod:`.federated`) and the fairness papers' central experiments (:mod:`.central`), with their data and tables."""
