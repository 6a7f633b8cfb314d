"""A hyper-parameter sweep (learning rate × global batch) of one network, trained elastically.

    pilotfill run workflows/hpo_campaign.py

Same shape as the NAS campaign: every configuration is an elastic training
job that grows and shrinks with the nodes the machine leaves idle; an ordinary
Parsl app picks the best once all have reported. The batch swept is the global
batch — the samples of each optimizer step, however many ranks share it
(``pilotfill.elastic.ElasticLoader``) — so the sweep measures the
configurations, not the nodes each happened to get; the app declares the
smallest, so no job is given more ranks than its batch feeds.

Runtime: ``train`` names ``runtime="torch"`` — torch.distributed.elastic with
``ElasticState`` (``pilotfill.workloads.digits`` under the torch runtime) —
so it runs under torch elastic whatever the site config's ``[runtime] kind``.
"""

import itertools
import os

from parsl import python_app

import pilotfill

LEARNING_RATES = [0.01, 0.05, 0.2]
BATCHES = [16, 64]
EPOCHS = int(os.environ.get("HPO_EPOCHS", "10"))


@pilotfill.elastic_app(min_nodes=1, max_nodes=2, runtime="torch", global_batch=16)  # torch.distributed.elastic, whatever the config says
def train(lr: float, batch: int, epochs: int = EPOCHS) -> dict:
    """One configuration, trained with torch.distributed and ElasticState; returns its validation accuracy."""
    from pilotfill.workloads.digits import train as train_digits

    result = train_digits(epochs=epochs, depth=2, width=64, activation="relu", lr=lr, batch=batch, step_delay_s=0.02)
    return {"lr": lr, "batch": batch, "val_accuracy": result["val_accuracy"]}


@python_app(executors=["local"])
def best(*results: dict) -> dict:
    return max(results, key=lambda r: r["val_accuracy"])


runs = [train(lr, b) for lr, b in itertools.product(LEARNING_RATES, BATCHES)]
for r in sorted((f.result() for f in runs), key=lambda r: -r["val_accuracy"]):
    print(f"lr {r['lr']:<5} batch {r['batch']:>3}  val accuracy {r['val_accuracy']:.4f}")
winner = best(*runs).result()
print(f"best: lr {winner['lr']}, batch {winner['batch']} ({winner['val_accuracy']:.4f})")
