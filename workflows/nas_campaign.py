"""Neural architecture search on scikit-learn's digits, trained elastically on harvested nodes.

    pilotfill run workflows/nas_campaign.py            # the embedded local cluster
    pilotfill run workflows/nas_campaign.py -c configs/perlmutter.toml

Each architecture (depth × width × activation) is one elastic training job on
however many nodes the allocator gives it (1 to 2 here),
growing and shrinking as the machine's main workload takes nodes back and
returns them. Every architecture trains with the same global batch (32
samples a step, ``pilotfill.elastic.ElasticLoader`` inside
``pilotfill.workloads.digits``) whatever nodes it was given, so the leaderboard
ranks the models, not the machine's history; rank 0 returns the validation
accuracy. An ordinary Parsl app ranks the results once all are in.

Runtime: ``train`` names none, so it runs on the config's (``[runtime] kind``):
torch.distributed.elastic with the embedded default, Elastic Horovod with
``configs/local.toml``. It can, because ``pilotfill.workloads.digits`` is
written for both (plain ``torch.distributed`` under the torch runtime,
``hvd.elastic`` under Horovod). Code written for one runtime names it:
``@pilotfill.elastic_app(..., runtime="horovod")``.
"""

import itertools
import json
import os

from parsl import python_app

import pilotfill

SEARCH_SPACE = {"depth": [1, 2], "width": [32, 96], "activation": ["relu", "tanh"]}
EPOCHS = int(os.environ.get("NAS_EPOCHS", "12"))
LR = float(os.environ.get("NAS_LR", "0.05"))


@pilotfill.elastic_app(min_nodes=1, max_nodes=2, global_batch=32)  # runtime: the config's (digits trains under torch elastic or Horovod)
def train(depth: int, width: int, activation: str, epochs: int = EPOCHS, lr: float = LR) -> dict:
    """Train one architecture on the configured runtime; returns its validation accuracy."""
    from pilotfill.workloads.digits import train as train_digits

    result = train_digits(epochs=epochs, depth=depth, width=width, activation=activation, lr=lr, batch=32, step_delay_s=0.02)
    return {"depth": depth, "width": width, "activation": activation, "val_accuracy": result["val_accuracy"]}


@python_app(executors=["local"])
def leaderboard(*results: dict) -> list:
    """An ordinary Parsl app that depends on every training: rank them."""
    return sorted(results, key=lambda r: -r["val_accuracy"])


trials = [train(d, w, a) for d, w, a in itertools.product(*SEARCH_SPACE.values())]
board = leaderboard(*trials).result()
print(f"{'rank':>4}  {'depth':>5}  {'width':>5}  {'activation':<10}  val accuracy")
for i, r in enumerate(board, 1):
    print(f"{i:>4}  {r['depth']:>5}  {r['width']:>5}  {r['activation']:<10}  {r['val_accuracy']:.4f}")
if os.environ.get("NAS_RESULTS"):
    with open(os.environ["NAS_RESULTS"], "w") as f:
        json.dump(board, f)
