"""The rank's side of `KerasEstimator.fit`: read this rank's share of the Parquet data
(hvdplus.spark.data), train with `model.fit` and hvdplus.keras's DistributedOptimizer and
callbacks, and keep a checkpoint in the store after every epoch.

Every rank steps as often as the rank with the fewest rows can (the all-reduces of a step need
every rank): each epoch draws that many batches from a new shuffle of the rank's rows.
"""

import os
import pickle
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

import keras
import numpy as np

from ..data import read_arrays

__all__ = ["train_on_rank", "model_bytes", "model_from_bytes"]


def model_bytes(model) -> bytes:
    """`model` as the bytes of a `.keras` file, which every backend loads."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.keras")
        model.save(path)
        with open(path, "rb") as file:
            return file.read()


def model_from_bytes(data: bytes, load, **options):
    """The model in the bytes of a `.keras` file, loaded by `load(path, **options)`."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.keras")
        with open(path, "wb") as file:
            file.write(data)
        return load(path, **options)


def train_on_rank(optimizer_config: Dict[str, Any], loss, metrics, custom_objects, callbacks, store, run_id: str,
                  train_path: str, val_path: Optional[str], feature_cols: Sequence[str], label_cols: Sequence[str],
                  batch_size: int, epochs: int, shuffle: bool, seed: int, verbose: int) -> Optional[Dict[str, Any]]:
    """On each rank: train the store's initial model of the run for the epochs the store's
    checkpoint has not done; rank 0 returns {"model": the trained model's bytes, "history":
    [metrics of each epoch]}, the others None."""
    import hvdplus.keras as hvd

    hvd.init()
    keras.utils.set_random_seed(seed)
    x, y = read_arrays(train_path, hvd.rank(), hvd.size(), feature_cols, label_cols)
    steps = int(np.asarray(hvd.allreduce(np.array([len(x) // batch_size]), op=hvd.Min, name="estimator.steps"))[0])
    if steps == 0:
        raise ValueError(f"hvdplus KerasEstimator: a rank has fewer than batch_size={batch_size} rows of training "
                         f"data; use a smaller batch_size or fewer ranks")
    model, first_epoch, history = _model_to_train(hvd, store, run_id, optimizer_config, loss, metrics,
                                                  custom_objects)
    validation = None
    if val_path is not None:
        validation = read_arrays(val_path, hvd.rank(), hvd.size(), feature_cols, label_cols)
    batches = _Batches(x, y, batch_size, steps, shuffle, np.random.default_rng(seed + hvd.rank()))
    recorder = _EpochRecorder(store, run_id, history, is_root=hvd.rank() == 0)
    model.fit(batches, epochs=epochs, initial_epoch=first_epoch, validation_data=validation,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                         *callbacks, recorder],
              verbose=2 if verbose else 0)
    return {"model": model_bytes(model), "history": history} if hvd.rank() == 0 else None


def _model_to_train(hvd, store, run_id, optimizer_config, loss, metrics, custom_objects):
    """(model compiled with a DistributedOptimizer, the epochs done, their metrics): rank 0's
    checkpoint of the run when the store has one, the initial model otherwise."""
    saved = store.read(store.checkpoint_path(run_id)) if hvd.rank() == 0 else None
    checkpoint = hvd.broadcast_object(saved, root_rank=0, name="estimator.checkpoint")
    if checkpoint is not None:
        state = pickle.loads(checkpoint)
        model = model_from_bytes(state["model"], hvd.load_model, custom_objects=custom_objects)
        return model, state["epoch"], state["history"]
    model = model_from_bytes(store.read(store.initial_model_path(run_id)), keras.saving.load_model,
                             custom_objects=custom_objects, compile=False)
    optimizer = keras.optimizers.deserialize(optimizer_config, custom_objects=custom_objects)
    model.compile(optimizer=hvd.DistributedOptimizer(optimizer), loss=loss, metrics=metrics)
    return model, 0, []


class _Batches(keras.utils.PyDataset):
    """`steps` batches an epoch, drawn from a new shuffle of the rows each epoch."""

    def __init__(self, x, y, batch_size: int, steps: int, shuffle: bool, generator):
        super().__init__()
        self.x, self.y, self.batch_size, self.steps = x, y, batch_size, steps
        self.shuffle, self.generator = shuffle, generator
        self.order = self._new_order()

    def _new_order(self):
        return self.generator.permutation(len(self.x)) if self.shuffle else np.arange(len(self.x))

    def __len__(self):
        return self.steps

    def __getitem__(self, index):
        rows = self.order[index * self.batch_size:(index + 1) * self.batch_size]
        return self.x[rows], self.y[rows]

    def on_epoch_end(self):
        self.order = self._new_order()


class _EpochRecorder(keras.callbacks.Callback):
    """Appends each epoch's metrics (averaged over ranks by the callback before it) to the
    history, and on rank 0 keeps the checkpoint in the store."""

    def __init__(self, store, run_id: str, history: List[Dict[str, Any]], is_root: bool):
        super().__init__()
        self.store, self.run_id, self.history, self.is_root = store, run_id, history, is_root
        self.began = time.perf_counter()

    def on_epoch_begin(self, epoch, logs=None):
        self.began = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        metrics = {"epoch": epoch + 1, **{name: float(value) for name, value in (logs or {}).items()},
                   "seconds": time.perf_counter() - self.began}
        self.history.append(metrics)
        if self.is_root:
            state = {"model": model_bytes(self.model), "epoch": epoch + 1, "history": self.history}
            self.store.write(self.store.checkpoint_path(self.run_id), pickle.dumps(state))
