"""KNN-ADS: the K-nearest-neighbour utility (:mod:`.utility`), exact ADS under it ([ADS] Thm 5.1,
Alg. 2: :mod:`.exact`) and its Monte Carlo estimate (:mod:`.monte_carlo`)."""
