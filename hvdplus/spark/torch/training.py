"""The rank's side of `TorchEstimator.fit`: read this rank's share of the Parquet data with
pyarrow, train with hvdplus's DistributedOptimizer, average the metrics over the ranks, and
keep a checkpoint in the store after every epoch.

Each rank reads every size()-th row group of the data, from its rank on; every rank steps as
often as the rank with the fewest rows can (the all-reduces of a step need every rank), so a
few rows of the larger shares are left out of an epoch, different ones each epoch.
"""

import io
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

__all__ = ["train_on_rank", "columns_as_array"]


def columns_as_array(table, columns: Sequence[str]) -> np.ndarray:
    """The columns of a pyarrow table (or a pandas DataFrame) as one float32 matrix: a column of
    numbers gives one feature, a column of arrays (or Spark ML vectors) as many as each holds."""
    parts = []
    for column in columns:
        values = _values(table, column)
        if values.dtype == object:  # arrays, one per row
            values = np.stack([np.asarray(value, dtype=np.float32) for value in values]) if len(values) else \
                np.zeros((0, 1), np.float32)
        parts.append(values.reshape(len(values), -1).astype(np.float32))
    return np.concatenate(parts, axis=1)


def _values(table, column: str) -> np.ndarray:
    values = table[column]
    # A pyarrow column hands its numbers over without a copy only when it has no nulls.
    return values.to_numpy(zero_copy_only=False) if hasattr(values, "combine_chunks") else values.to_numpy()


def _labels(table, columns: Sequence[str]) -> np.ndarray:
    values = np.column_stack([_values(table, column) for column in columns])
    if np.issubdtype(values.dtype, np.integer):
        return values.reshape(-1).astype(np.int64) if values.shape[1] == 1 else values.astype(np.int64)
    return values.astype(np.float32)


def _tensors(table, feature_cols, label_cols):
    import torch

    return torch.from_numpy(columns_as_array(table, feature_cols)), torch.from_numpy(_labels(table, label_cols))


def _read_share(path: str, rank: int, size: int, columns: List[str]):
    """This rank's row groups of the Parquet files under `path`, as one pyarrow table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    dataset = pq.ParquetDataset(path)
    groups = [(fragment.path, group) for fragment in sorted(dataset.fragments, key=lambda f: f.path)
              for group in range(fragment.metadata.num_row_groups)]
    mine = groups[rank::size]
    tables = [pq.ParquetFile(file).read_row_group(group, columns=columns) for file, group in mine]
    return pa.concat_tables(tables) if tables else dataset.read(columns=columns).slice(0, 0)


def train_on_rank(model, optimizer, loss, store, run_id: str, train_path: str, val_path: Optional[str],
                  feature_cols: Sequence[str], label_cols: Sequence[str], batch_size: int, epochs: int,
                  shuffle: bool, seed: int, verbose: int) -> Dict[str, Any]:
    """On each rank: train `model` for the epochs the store's checkpoint has not done; rank 0
    returns {"model": state_dict, "history": [metrics of each epoch]}, the others None."""
    import torch

    import hvdplus.torch as hvd

    hvd.init()
    torch.manual_seed(seed)
    optimizer = type(optimizer)(model.parameters(), **optimizer.defaults)
    columns = list(feature_cols) + list(label_cols)
    train = _read_share(train_path, hvd.rank(), hvd.size(), columns)
    x, y = _tensors(train, feature_cols, label_cols)
    validation = None
    if val_path is not None:
        validation = _tensors(_read_share(val_path, hvd.rank(), hvd.size(), columns), feature_cols, label_cols)
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
