"""The wire contract between the server and every ClientApp: record keys and the train config.

Both sides import these names (the ClientApp in :mod:`clients.app`, the server in
:mod:`strategies.replies` and the simulations), so a key is spelled once. Constants and a
builder only: no Flower types, so a ClientApp depends on nothing else of the server side
(as Flower's differential-privacy constants serve its server wrapper and client mod alike).

Train message: ``"arrays"`` (the global model) and ``"config"`` (:func:`train_config`; FedAvg
adds ``"server-round"``, FedProx ``"proximal-mu"``). Reply: ``"arrays"``, ``"metrics"``
(``"num-examples"``, ``"train-loss"``) and ``"client"`` (a ConfigRecord holding
``"partition-id"``: in a MetricRecord FedAvg would average it), plus, for TracIn flows, the
``"inference-gradient"`` ArrayRecord and ``"inference-loss"`` in ``"client"``, and, for fairness
influence with curvature, the ``"fair-curvature"`` ArrayRecord (``"gradient/KEY"``: the training
loss gradient Σ_n ∇ℓ_n, ``"fisher/KEY"``: the empirical Fisher diagonal Σ_n ∇ℓ_n², both at the
received arrays, float64).
"""

from __future__ import annotations

from fedvalue.schema import NUM_EXAMPLES_KEY  # noqa: F401 (the wire names the example count as the ledger does)

ARRAYS_KEY = "arrays"
METRICS_KEY = "metrics"
CONFIG_KEY = "config"
#: ConfigRecord a client puts in every reply to say who it is.
CLIENT_RECORD_KEY = "client"
PARTITION_ID_KEY = "partition-id"
TRAIN_LOSS_KEY = "train-loss"
#: Config flag asking for the inference gradient, and the reply's ArrayRecord holding it.
GRADIENT_KEY = "inference-gradient"
INFERENCE_LOSS_KEY = "inference-loss"
#: Config flag asking for the training loss gradient and Fisher diagonal, and the reply's ArrayRecord.
CURVATURE_KEY = "fair-curvature"
CURVATURE_GRADIENT_PREFIX = "gradient/"
CURVATURE_FISHER_PREFIX = "fisher/"
#: Config flag of a query asking for the client's mean training loss at the query's arrays (Power-of-Choice
#: selection), and the ``"client"`` ConfigRecord entry answering it.
LOCAL_LOSS_KEY = "local-loss"
#: Config key marking the server's own queries (the directory's, and TracIn's gradient query):
#: ``"directory"`` or ``"inference-gradient"``. A ClientApp without an ``@app.query`` handler
#: gets them as ``evaluate`` messages carrying this key, which ``clients.valuation_mod``
#: answers before the app's own evaluate handler is reached.
QUERY_KEY = "fedvalue-query"
DIRECTORY_QUERY = "directory"
GRADIENT_QUERY = "inference-gradient"
#: Which run's data a client loads when one engine serves several runs (a study's seeds).
DATA_KEY = "data-key"
#: FedProx's configure_train puts its μ here.
PROXIMAL_MU_KEY = "proximal-mu"
LEARNING_RATE_KEY = "lr"
LOCAL_EPOCHS_KEY = "local-epochs"
BATCH_SIZE_KEY = "batch-size"
SEED_KEY = "seed"
SERVER_ROUND_KEY = "server-round"


def train_config(*, learning_rate: float, local_epochs: int, batch_size: int = 0, seed: int = 0,
                 data_key: str | None = None) -> dict[str, int | float | str]:
    """The train config every simulation sends (``batch_size`` 0: full batch)."""
    config: dict[str, int | float | str] = {
        LEARNING_RATE_KEY: float(learning_rate), LOCAL_EPOCHS_KEY: int(local_epochs),
        BATCH_SIZE_KEY: int(batch_size), SEED_KEY: int(seed),
    }
    if data_key is not None:
        config[DATA_KEY] = data_key
    return config
