"""Data and models that several experiments share: local data sets (:mod:`.loaders`), client
partitions (:mod:`.partitions`), R data frames of Debian's r-cran packages (:mod:`.r_data`) and the
torch models (:mod:`.models`). Imports no experiment and no CLI."""
