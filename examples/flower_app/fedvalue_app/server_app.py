"""fedvalue-app: A Flower / PyTorch app (Flower's template ServerApp, its strategy wrapped; its run
config kept in run.json; signed when the run config names a key)."""

import os

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fedvalue_app.task import Net
from strategies import PartitionSampler, RunSettings, Signer, ValuingStrategy

# Create ServerApp
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Main entry point for the ServerApp."""

    # Read run config
    fraction_evaluate: float = context.run_config["fraction-evaluate"]
    num_rounds: int = context.run_config["num-server-rounds"]
    lr: float = context.run_config["learning-rate"]

    # Load global model
    torch.manual_seed(0)
    global_model = Net()
    arrays = ArrayRecord(global_model.state_dict())

    # Initialize FedAvg strategy; fedvalue: wrapped, its clients valued on the server's held-out data
    run_dir = os.path.expanduser(str(context.run_config["run-dir"])).replace("{run_id}", str(context.run_id))
    sign_key = str(context.run_config.get("sign-key", ""))  # a PEM from `fedvalue keygen`; "" = unsigned
    strategy = ValuingStrategy(
        FedAvg(fraction_evaluate=fraction_evaluate),
        "fedvalue_app.task:held_out_utility",  # U, importable: `fedvalue audit` rebuilds it
        run_dir=run_dir,
        sampler=PartitionSampler(int(context.run_config["clients-per-round"]), seed=0),
        run=RunSettings(run_config=dict(context.run_config),  # run.json keeps the app's run config
                        sign_key=Signer.from_file(os.path.expanduser(sign_key)) if sign_key else None),
    )

    # Start strategy, run FedAvg for `num_rounds`
    result = strategy.start(
        grid=grid,
        initial_arrays=arrays,
        train_config=ConfigRecord({"lr": lr}),
        num_rounds=num_rounds,
    )

    # Save final model to disk (beside the books)
    print("\nSaving final model to disk...")
    state_dict = result.arrays.to_torch_state_dict()
    torch.save(state_dict, os.path.join(os.path.dirname(run_dir) or ".", f"{os.path.basename(run_dir)}-final_model.pt"))
