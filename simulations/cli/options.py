"""What the sub-commands share: parameter help, option types, the config-to-options mapping, and
errors of the Python interface in the command line's words."""

from __future__ import annotations

import argparse
import re
import types
import typing
from collections.abc import Mapping

from simulations.runner.engine_settings import flat_fields
from simulations.runner.inner_strategies import STRATEGIES, STRATEGY_PARAMETERS

PARAMETER_HELP = {
    "seed": "seed of everything random in the run (same seed, same ledger)",
    "dataset": "digits (embedded), breast-cancer, diabetes, fashion-mnist (Debian's dataset-fashion-mnist), or "
               "mnist (needs --data-path)",
    "data_path": "fashion-mnist or mnist: directory of the IDX files or an .npz (x_train, y_train, x_test, y_test); "
                 "fashion-mnist defaults to /usr/share/datasets/fashion-mnist",
    "mnist_path": "directory of MNIST IDX files or an .npz (x_train, y_train, x_test, y_test)",
    "holdout_fraction": "share of the data held out for the server's utility (fashion-mnist and mnist hold out "
                        "their test split)",
    "num_clients": "number of clients (partitions)",
    "rounds": "federated rounds",
    "clients_per_round": "clients sampled per round",
    "schedule": "even (each client once per pass, [ADS] App. C.2) or random",
    "partition": "Flower Datasets partitioner: iid, dirichlet (label skew), pathological or shard",
    "dirichlet_alpha": "concentration of the label-skew partition",
    "classes_per_partition": "pathological partition: classes each client holds",
    "shards_per_partition": "shard partition: label-sorted shards each client holds",
    "noisy_fraction": "share of clients with label noise",
    "flip_probability": "probability a noisy client's label is flipped to another class",
    "hidden": "hidden layer sizes, comma-separated",
    "local_epochs": "local epochs per round",
    "learning_rate": "local SGD learning rate",
    "batch_size": "local batch size (0 = full batch)",
    "strategy": "inner Flower strategy: " + ", ".join(STRATEGIES),
    "methods": "valuations per round, comma-separated: ads,loo",
    "ads_method": "auto (exact when no dearer than MC; with --stderr-target the cheapest sampler), exact, mc, "
                  "tmc (truncated MC), antithetic, stratified, kernelshap; first-order or second-order (the round "
                  "game's Taylor expansion at the round's start: --utility neg_loss, fedavg or fedprox); or adaptive "
                  "(MC-ADS drawing only clients whose side of --adaptive-decision is unsure)",
    "adaptive_decision": "--ads-method adaptive: threshold (is a client's value above --adaptive-cut?) or top-k "
                         "(is it among the round's --adaptive-top-k best?)",
    "adaptive_cut": "--ads-method adaptive, threshold decision: the cut the values are decided against (0: is a "
                    "client harmful?)",
    "adaptive_top_k": "--ads-method adaptive, top-k decision: how many clients of a round the decision takes "
                      "(1 to --clients-per-round)",
    "adaptive_z": "--ads-method adaptive: one-look quantile of the decision's intervals (2: one-sided level 0.023; "
                  "each look tests at a Bonferroni-corrected one)",
    "epsilon": "MC-ADS accuracy ε",
    "delta": "MC-ADS failure probability δ",
    "truncation_tolerance": "tmc: a permutation stops when |v(I_t) − v(prefix)| is within this",
    "stderr_target": "sampling methods: stop sampling once every client's standard error is below this "
                     "(unset = run all m* permutations)",
    "utility": "accuracy, neg_loss",
    "num_cpus_per_client": "CPUs Ray gives each client",
    "num_gpus_per_client": "GPUs Ray gives each client (0 = none; fractions share a GPU)",
    "device": "torch device of the server's valuation (the utility's forward passes) and of the clients' training: "
              "cpu, cuda, cuda:1, ... (a CUDA device trains each client on the GPU of its Ray share: give "
              "--num-gpus-per-client > 0, e.g. 0.1)",
    "max_parallel_clients": "clients training at once (unset = sized for the machine)",
    "ray_address": "attach to an existing Ray cluster at this address (unset = a local Ray)",
    "round_timeout": "seconds to wait for a round's replies",
    "query_timeout": "seconds to wait for the clients to report their partition ids (raise it on a loaded "
                     "machine)",
    "valuation_workers": "Ray actors scoring coalitions in parallel (0 = in the server process)",
    "model": "mlp (--hidden layers) or cnn (LeNet-5-style, for square images)",
    "examples_per_client": "class-balanced training examples per client (0 = equal shares of the whole training "
                           "pool); [ADS] 6.2 uses 120",
    "holdout_examples": "class-balanced sample of the held-out set for the utility (0 = all of it)",
    "valuation_budget": "coalition evaluations per round (e.g. 2000) or seconds per round (e.g. 30s) for ADS and "
                        "LOO together; auto then picks exact or a sampler that fits (unset = no budget)",
    "fixed_second_order": "also book ads_fixed_second_order each round: the Shapley value of the fixed-weight round "
                          "game's second-order expansion, u_k·(g + ½ H U), which pays identities whose claims and "
                          "weighted updates add up what one client is paid (--utility neg_loss, fedavg or fedprox)",
    "seeds": "number of seeds averaged over (the study runs them all on one engine)",
    "first_seed": "first seed of the study",
    "ks": "top-k sizes retrained, comma-separated",
    "clean_runs": "1: also run each seed with the label noise off (flagging false-positive rate); 0: skip",
    "repetitions": "random training/inference splits averaged over",
    "steps": "full-batch gradient-descent steps T (0 = the paper's: 600 breast-cancer, 200 diabetes)",
    "averaging": "conditional (mean over the splits that put an individual on each side) or all-splits",
    "target": "diabetes target: raw (the paper's) or standardized",
    "p": "population fraction at which alpha is reported",
    "attacks": "attacks to run, comma-separated (none = the honest baseline)",
    "attacker": "partition id of the attacking client",
    "source": "partition id the replicator copies",
    "noise_std": "standard deviation of the perturbing free-rider's noise",
    "inflation": "factor by which the inflating client multiplies its example count",
    "boost": "scale of the boosting attacker's update",
    "median_multiple": "claim review: cap at this multiple of the round's median claim",
    "jump_factor": "claim review: flag a claim above this multiple of the client's previous one",
    **{name: text for name, (_, text) in STRATEGY_PARAMETERS.items()},
    # augmentation and replication-market ([ADS] §6.1)
    "train_per_class": "original training instances per class (breast-cancer: of the majority class)",
    "test_per_class": "test instances per class (breast-cancer: of the majority class)",
    "rotation": "augmentation: largest rotation in degrees (drawn uniformly in ±rotation)",
    "shift": "augmentation: largest shift as a share of the image side",
    "scale": "augmentation: zoom drawn uniformly in 1 ± scale",
    "imbalance": "breast-cancer: minority count as a share of the majority count (train and test)",
    "smote_neighbors": "breast-cancer: Borderline-SMOTE neighbours",
    "k": "neighbours K of the KNN model and utility",
    "permutations": "permutations of MC-ADS and MC-DS per run",
    "max_fraction": "largest share of the synthetic instances removed or added",
    "fraction_steps": "steps from 0 to max-fraction",
    "contributors": "contributors sharing the originals",
    "max_copies": "replication: the broker adds 1..max-copies exact copies of every original",
}


def _parse_tuple(kind):
    def parse(text: str):
        try:
            return tuple(kind(part) for part in text.split(",") if part.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__} values; got {text!r}") from None
    return parse


#: reStructuredText roles and literals in docstrings and help texts, and their plain-text form.
_ROLE = re.compile(r":(?:func|class|mod|meth|data|attr):`~?(?:[\w.]+\.)?([\w]+)`")
_LITERAL = re.compile(r"``(.+?)``")


def plain(text: str) -> str:
    """``text`` as plain text for a terminal: ``literal`` -> literal, :func:`a.b` -> b."""
    return _LITERAL.sub(r"\1", _ROLE.sub(r"\1", text))


def subcommand(commands, name: str, **options) -> argparse.ArgumentParser:
    """A sub-command parser: no abbreviated options (``--num-client`` is not ``--num-clients``),
    help in plain text."""
    if "help" in options:
        options["help"] = plain(options["help"])
    return commands.add_parser(name, allow_abbrev=False, **options)


#: Other spellings of an option (``--attack NAME`` for one attack).
ALIASES = {"attacks": ("--attack",)}


def add_config_options(parser: argparse.ArgumentParser, config_cls, own_help=None) -> None:
    """One ``--option`` per field of ``config_cls``, its engine options flat (``--num-cpus-per-client``,
    not one option for the nested :class:`~simulations.runner.engine_settings.EngineSettings`: see
    :func:`~simulations.runner.engine_settings.flat_fields`), a field ``bool = False`` a flag taking no
    value; its help from ``own_help`` (the simulation's own texts), else :data:`PARAMETER_HELP`."""
    own_help = own_help or {}
    for f in flat_fields(config_cls):
        hint = f.hint
        default = f.default
        if hint is bool and default is False:
            parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, action="store_true",
                                help=plain(own_help.get(f.name) or PARAMETER_HELP.get(f.name, "")))
            continue
        if typing.get_origin(hint) in (typing.Union, types.UnionType):  # X | None: None unless given
            (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if typing.get_origin(hint) is tuple:
            (kind, _) = typing.get_args(hint)
            parse = _parse_tuple(kind)
            shown = ",".join(str(v) for v in default)
        else:
            parse, shown = hint, ("unset" if default is None else default)
        parser.add_argument(
            "--" + f.name.replace("_", "-"), *ALIASES.get(f.name, ()), dest=f.name, type=parse, default=default,
            metavar=f.name.upper(),
            help=plain(f"{own_help.get(f.name) or PARAMETER_HELP.get(f.name, '')} (default: {shown})"),
        )


def finite_non_negative(name: str):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not (value >= 0 and value != float("inf")):
            raise argparse.ArgumentTypeError(f"{name}: expected a finite number >= 0; got {text!r}")
        return value
    return parse


def finite_positive(name: str):
    def parse(text: str) -> float:
        value = finite_non_negative(name)(text)
        if value == 0:
            raise argparse.ArgumentTypeError(f"{name}: expected a finite number > 0; got {text!r}")
        return value
    return parse


#: The library names run-directory parameters and opt-ins in Python's words; the command line says them in
#: its own (a message that gives both, "resume=True (--resume DIR)", keeps the second).
_CLI_WORDS = (
    (re.compile(r"\b(?:resume|overwrite|allow_undefended)=True \((--[\w-]+(?: DIR)?)\)"), r"\1"),
    (re.compile(r"\bresume=True\b"), "--resume DIR"),
    (re.compile(r"\boverwrite=True\b"), "--overwrite"),
    # An option left out is None in Python; on the command line it is not given at all.
    (re.compile(r" or None(?=[;.,)])"), " (or leave the option out)"),
)


def command_line_options(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Python parameter name -> its long option (``clients_per_round`` -> ``--clients-per-round``),
    for every option of ``parser`` and its sub-commands."""
    options: dict[str, str] = {}
    for action in parser._actions:  # argparse keeps no public list of a parser's options
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                options.update(command_line_options(sub))
        long = [o for o in action.option_strings if o.startswith("--")]
        if long and action.dest != "help":
            options.setdefault(action.dest, long[0])
    return options


def in_cli_words(message: str, options: Mapping[str, str] | None = None) -> str:
    """An error raised by the Python interface, in the command line's words: ``resume=True``
    as ``--resume DIR``, and a parameter named as ``name:`` or ``name=value`` as its option
    (``options``: :func:`command_line_options`)."""
    for pattern, replacement in _CLI_WORDS:
        message = pattern.sub(replacement, message)
    for name, option in (options or {}).items():
        message = re.sub(rf"(^|; |\. )({re.escape(name)}):", rf"\g<1>{option}:", message)
        message = re.sub(rf"(?<![\w-]){re.escape(name)}=(?!True\b)", f"{option} ", message)
    return message


