"""The rank's side of `TorchEstimator.fit`: read this rank's share of the Parquet data
(hvdplus.spark.data), train with hvdplus's DistributedOptimizer, average the metrics over the
ranks, and keep a checkpoint in the store after every epoch.

Every rank steps as often as the rank with the fewest rows can (the all-reduces of a step need
every rank), so a few rows of the larger shares are left out of an epoch, different ones each
epoch.
"""

import io
import time
from typing import Any, Dict, Optional, Sequence

import numpy as np

from ..data import read_arrays

__all__ = ["train_on_rank"]


def train_on_rank(optimizer_class, optimizer_options, loss, store, run_id: str, train_path: str,
                  val_path: Optional[str], feature_cols: Sequence[str], label_cols: Sequence[str],
                  batch_size: int, epochs: int, shuffle: bool, seed: int, verbose: int) -> Dict[str, Any]:
    """On each rank: train the store's initial model of the run, with an optimizer of
    `optimizer_class` and `optimizer_options`, for the epochs the store's checkpoint has not
    done; rank 0 returns {"model": state_dict, "history": [metrics of each epoch]}, the others None."""
    import torch

    import hvdplus.torch as hvd

    hvd.init()
    torch.manual_seed(seed)
    model = torch.load(io.BytesIO(store.read(store.initial_model_path(run_id))), weights_only=False)
    optimizer = optimizer_class(model.parameters(), **optimizer_options)
    x, y = map(torch.from_numpy, read_arrays(train_path, hvd.rank(), hvd.size(), feature_cols, label_cols))
    validation = None
    if val_path is not None:
        validation = tuple(map(torch.from_numpy, read_arrays(val_path, hvd.rank(), hvd.size(), feature_cols,
                                                             label_cols)))
    first_epoch, history = _resume(model, optimizer, store, run_id, hvd)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    distributed = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    steps = int(hvd.allreduce(torch.tensor([len(x) // batch_size]), op=hvd.Min)[0])
    if steps == 0:
        raise ValueError(f"hvdplus TorchEstimator: a rank has fewer than batch_size={batch_size} rows of training "
                         f"data; use a smaller batch_size or fewer ranks")
    generator = np.random.default_rng(seed + hvd.rank())
    for epoch in range(first_epoch, epochs):
        began = time.perf_counter()
        model.train()
        order = generator.permutation(len(x)) if shuffle else np.arange(len(x))
        total = torch.zeros(())
        for step in range(steps):
            rows = torch.from_numpy(order[step * batch_size:(step + 1) * batch_size])
            distributed.zero_grad()
            step_loss = loss(model(x[rows]), y[rows])
            step_loss.backward()
            distributed.step()
            total += step_loss.detach()
        metrics = {"epoch": epoch + 1, "loss": float(hvd.allreduce(total / steps, op=hvd.Average)),
                   "seconds": time.perf_counter() - began}
        if validation is not None:
            metrics.update(_validate(model, loss, validation, hvd))
        history.append(metrics)
        if hvd.rank() == 0:
            _save(store, run_id, model, optimizer, epoch + 1, history)
            if verbose:
                shown = (f"{name} {value:.4g}" if isinstance(value, float) else f"{name} {value}"
                         for name, value in metrics.items())
                print("hvdplus TorchEstimator: " + ", ".join(shown), flush=True)
    return {"model": model.state_dict(), "history": history} if hvd.rank() == 0 else None


def _validate(model, loss, validation, hvd) -> Dict[str, float]:
    """The loss, and the accuracy of integer labels, over every rank's validation rows."""
    import torch

    x, y = validation
    model.eval()
    with torch.no_grad():
        output = model(x)
        sums = [loss(output, y) * len(x) if len(x) else torch.zeros(()), torch.tensor(float(len(x)))]
        if not y.is_floating_point() and output.dim() == 2:
            sums.append((output.argmax(dim=1) == y).sum().float())
    totals = hvd.allreduce(torch.stack([value.reshape(()) for value in sums]), op=hvd.Sum)
    metrics = {"val_loss": float(totals[0] / totals[1])}
    if len(totals) == 3:
        metrics["val_accuracy"] = float(totals[2] / totals[1])
    return metrics


def _resume(model, optimizer, store, run_id, hvd):
    """(the epochs the store's checkpoint has done, their metrics), the model and optimizer
    loaded from it on rank 0; (0, []) without one."""
    import torch

    saved = store.read(store.checkpoint_path(run_id)) if hvd.rank() == 0 else None
    if saved is None:
        return hvd.broadcast_object((0, []), root_rank=0)
    checkpoint = torch.load(io.BytesIO(saved), weights_only=False)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    return hvd.broadcast_object((checkpoint["epoch"], checkpoint["history"]), root_rank=0)


def _save(store, run_id, model, optimizer, epochs_done, history) -> None:
    import torch

    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epochs_done,
                "history": history}, buffer)
    store.write(store.checkpoint_path(run_id), buffer.getvalue())
