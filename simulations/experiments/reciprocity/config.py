"""The reciprocity reproduction's configuration and the papers' numbers ([RECIP] §5).

One configuration serves the healthcare data sets (§5.2, :mod:`simulations.experiments.reciprocity.centralized`) and
MovieLens (§5.1, :mod:`simulations.experiments.reciprocity.movielens`); fields at 0 or "" mean the paper's value for
the dataset.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from simulations.runner import check_choice, check_integer, check_number, check_unit_interval

#: How the healthcare models start (:mod:`simulations.experiments.reciprocity.training`).
INITIALIZATIONS = ("average-label", "zero")

HEALTHCARE = ("breast-cancer", "diabetes")
DATASETS = (*HEALTHCARE, "movielens")
AVERAGINGS = ("conditional", "all-splits")
TARGETS = ("raw", "standardized")
#: The diabetes loss: (f − y)² (the default, "squared error" of §5.2) or ½(f − y)² (App. A's form).
SQUARED_LOSSES = ("plain", "half")
INFLUENCES = ("tracin", "marginal", "both")

#: [RECIP] §5.2 and footnote 4 (model, T, η, 100 splits; α reported for TracIn and Marginal),
#: the workshop version's §5.2.1 (90th percentile of the Marginal outflow SNR) and Fig. 6
#: (diabetes trained for 1,000 steps). Pearson is not reported for these data sets.
PAPER = {
    "breast-cancer": {"model": "logistic", "steps": 600, "learning_rate": 0.1, "repetitions": 100,
                      "alpha": 0.93, "marginal_alpha": 0.48, "marginal_snr_p90": 0.58},
    "diabetes": {"model": "linear", "steps": 200, "learning_rate": 0.01, "repetitions": 100,
                 "alpha": 0.76, "marginal_alpha": 0.36, "marginal_snr_p90": 0.55, "alpha_at_1000_steps": 0.20},
}

#: Help of the options that are this simulation's own (``fedvalue run reciprocity --help``).
RECIPROCITY_HELP = {
    "dataset": "breast-cancer, diabetes ([RECIP] §5.2), movielens (§5.1, the dslabs ratings), or all",
    "repetitions": "random training/inference splits averaged over (0 = the paper's: 100 healthcare, 10 movielens)",
    "steps": "full-batch gradient-descent steps T (0 = the paper's: 600 breast-cancer, 200 diabetes, 1000 movielens)",
    "learning_rate": "gradient-descent learning rate (0 = the paper's: 0.1, 0.01, 0.0002)",
    "averaging": "headline averaging over splits: conditional (mean over the splits that put an individual on "
                 "each side) or all-splits (both are reported)",
    "influence": "tracin, marginal (removal and retraining, [RECIP] Eq. 3; TracIn is reported beside it) or both",
    "initialization": "healthcare: average-label (the workshop version's: the model starts by predicting the mean "
                      "training label) or zero; movielens: random (empty = the paper's)",
    "initializations": "movielens: random initializations per split (0 = the paper's 10)",
    "dimension": "movielens: embedding dimension d",
    "regularization": "movielens: regularization coefficient lambda",
    "init_scale": "movielens: embeddings start with N(0, init-scale^2) entries",
    "min_item_ratings": "movielens: keep movies with at least this many ratings (1 = all 9,066)",
    "train_fraction": "share of the ratings in the training split (0 = the paper's: 0.8 movielens; healthcare "
                      "splits are half/half)",
    "marginal_users": "movielens Marginal: users sampled (all their ratings), one retraining per user",
    "checkpoint_every": "keep the cumulative flows every this many steps for alpha along training (0 = T/100)",
    "squared_loss": "diabetes: plain (loss (f - y)^2, the default) or half (1/2 (f - y)^2, as [RECIP] App. A writes "
                    "its loss; halves every gradient at the same learning rate)",
    "local_steps": "movielens: 0 = centralized gradient descent (the paper); E >= 1 = federated per user: --steps "
                   "rounds, each user a client keeping its own embedding and taking E local steps",
}


@dataclass
class ReciprocityConfig:
    """Every number of the centralized reproduction ([RECIP] §5).

    ``repetitions``, ``steps``, ``learning_rate``, ``initializations``, ``train_fraction``
    and ``initialization`` at 0 / "" mean the paper's values for the dataset.
    """

    seed: int = 0
    dataset: str = "breast-cancer"
    repetitions: int = 0
    steps: int = 0
    learning_rate: float = 0.0
    averaging: str = "conditional"
    target: str = "raw"
    p: float = 0.75
    influence: str = "tracin"
    initialization: str = ""
    initializations: int = 0
    dimension: int = 16
    regularization: float = 1.0
    init_scale: float = 0.1
    min_item_ratings: int = 10
    train_fraction: float = 0.0
    marginal_users: int = 100
    checkpoint_every: int = 0
    local_steps: int = 0
    squared_loss: str = "plain"

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def _paper(self) -> dict:
        return MOVIELENS_PAPER if self.dataset == "movielens" else PAPER[self.dataset]

    @property
    def steps_used(self) -> int:
        return int(self.steps) if self.steps else self._paper()["steps"]

    @property
    def learning_rate_used(self) -> float:
        return float(self.learning_rate) if self.learning_rate else self._paper()["learning_rate"]

    @property
    def repetitions_used(self) -> int:
        return int(self.repetitions) if self.repetitions else self._paper()["repetitions"]

    @property
    def initialization_used(self) -> str:
        return self.initialization or ("random" if self.dataset == "movielens" else "average-label")

    @property
    def model(self) -> str:
        """The healthcare model of :mod:`simulations.experiments.reciprocity.training`: logistic, linear or linear-half."""
        model = self._paper().get("model", "")
        return "linear-half" if model == "linear" and self.squared_loss == "half" else model

    @property
    def influences(self) -> tuple[str, ...]:
        return ("tracin", "marginal") if self.influence in ("marginal", "both") else ("tracin",)

    @property
    def checkpoint_every_used(self) -> int:
        return int(self.checkpoint_every) if self.checkpoint_every else max(1, self.steps_used // 100)


def check(config: ReciprocityConfig) -> None:
    """ValueError naming the first bad field of ``config``."""
    if not isinstance(config, ReciprocityConfig):
        raise TypeError(f"config: expected a ReciprocityConfig; got {type(config).__name__}.")
    check_integer("seed", config.seed, 0)
    check_choice("dataset", config.dataset, DATASETS)
    check_integer("repetitions", config.repetitions, 0, none_ok=True, why="0 or None = the paper's")
    check_integer("steps", config.steps, 0, none_ok=True, why="0 or None = the paper's")
    check_number("learning_rate", config.learning_rate, low=0.0, none_ok=True, why="0 or None = the paper's")
    check_choice("averaging", config.averaging, AVERAGINGS)
    check_choice("target", config.target, TARGETS)
    if config.target == "standardized" and config.dataset != "diabetes":
        raise ValueError(f"target: 'standardized' applies to the diabetes regression only; got dataset "
                         f"{config.dataset!r}.")
    check_unit_interval("p", config.p)
    check_choice("influence", config.influence, INFLUENCES)
    allowed = ("", "random") if config.dataset == "movielens" else ("", *INITIALIZATIONS)
    if config.initialization not in allowed:
        raise ValueError(f"initialization: expected one of {list(allowed[1:])} for dataset {config.dataset!r} "
                         f"(or empty for the paper's); got {config.initialization!r}.")
    check_integer("initializations", config.initializations, 0, why="0 = the paper's")
    if config.dataset != "movielens" and config.initializations > 1:
        raise ValueError(f"initializations: the healthcare models start deterministically; expected 0 or 1 for "
                         f"dataset {config.dataset!r}; got {config.initializations}.")
    check_integer("dimension", config.dimension)
    check_number("regularization", config.regularization, low=0.0)
    check_number("init_scale", config.init_scale, low=0.0)
    check_integer("min_item_ratings", config.min_item_ratings)
    check_number("train_fraction", config.train_fraction, low=0.0, high=1.0, high_open=True,
                 why="0 = the paper's")
    if config.dataset != "movielens" and config.train_fraction not in (0, 0.5):
        raise ValueError(f"train_fraction: the healthcare splits are half/half (every example equally likely on "
                         f"either side); expected 0 or 0.5 for dataset {config.dataset!r}; got "
                         f"{config.train_fraction!r}.")
    check_integer("marginal_users", config.marginal_users, 2)
    check_integer("checkpoint_every", config.checkpoint_every, 0, why="0 = T/100")
    check_choice("squared_loss", config.squared_loss, SQUARED_LOSSES)
    if config.squared_loss != "plain" and config.dataset != "diabetes":
        raise ValueError(f"squared_loss: {config.squared_loss!r} applies to the diabetes regression only; expected "
                         f"'plain' for dataset {config.dataset!r}.")
    check_integer("local_steps", config.local_steps, 0, why="0 = centralized")
    if config.local_steps and config.dataset != "movielens":
        raise ValueError(f"local_steps: federated training per user is the movielens extension; expected 0 for "
                         f"dataset {config.dataset!r}; got {config.local_steps}.")
    if config.local_steps and config.influence != "tracin":
        raise ValueError(f"local_steps: the Marginal experiment retrains centrally; expected influence 'tracin' with "
                         f"local_steps={config.local_steps}; got {config.influence!r}.")


#: [RECIP] §5.1, footnote 3, App. C (the workshop version's numbers where it differs, in
#: ``workshop``): model settings and reported figures.
MOVIELENS_PAPER = {
    "steps": 1000, "learning_rate": 2e-4, "repetitions": 10, "initializations": 10, "dimension": 16,
    "regularization": 1.0, "train_fraction": 0.8,
    "alpha_single": 0.16, "alpha_splits": 0.58, "pearson_single": 0.89, "pearson_splits": 0.98,
    "negative_inflow_single": 0.007, "negative_outflow_single": 0.196,
    "negative_inflow_splits": 0.001, "negative_outflow_splits": 0.08,
    "first_order_p80": 0.011, "tracin_outflow_snr_p10": 76.0, "marginal_outflow_snr_p90": 0.49,
    "inference_rmse": 0.925,
    "workshop": {"alpha_single": 0.2, "alpha_splits": 0.48, "pearson_splits": 0.97, "negative_inflow_single": 0.005,
                 "negative_outflow_single": 0.169, "negative_inflow_splits": 0.0, "negative_outflow_splits": 0.111},
}
