"""`KerasEstimator`: fit a Keras 3 model to a Spark DataFrame with hvdplus, as a Spark ML
estimator, on the tensorflow, torch or jax backend.

    from hvdplus.spark.keras import KerasEstimator
    from hvdplus.spark.store import LocalStore

    estimator = KerasEstimator(num_proc=2, model=model, optimizer=keras.optimizers.Adam(1e-3),
                               loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                               store=LocalStore("/tmp/store"), feature_cols=["features"],
                               label_cols=["label"], batch_size=32, epochs=10, validation=0.1)
    model = estimator.fit(train_df)              # a KerasModel, a Spark ML Model
    predictions = model.transform(test_df)        # adds "label__output"
    keras_model = model.getModel()

`fit` writes the DataFrame's feature and label columns as Parquet into the store, and the model
as a `.keras` file; the ranks train it with `model.fit`, hvdplus.keras's DistributedOptimizer
and its broadcast and metric-average callbacks (hvdplus.spark.keras.training). After each epoch
rank 0 keeps a checkpoint in the store, and a later `fit` with the same `run_id` goes on from it.
"""

from typing import Any, Dict, Optional, Sequence

import keras

from ..estimator import Estimator, EstimatorModel
from ..runner import run
from .training import model_bytes, model_from_bytes, train_on_rank

__all__ = ["KerasEstimator", "KerasModel"]


class KerasEstimator(Estimator):
    """Fits a Keras 3 model to a DataFrame on `num_proc` ranks, in Horovod's shape; the
    arguments are those of `hvdplus.spark.estimator.Estimator`, with

    Args:
        model: the Keras model to train (built: it knows its input shape).
        optimizer: a Keras optimizer; the ranks wrap one of its class and settings in
            hvdplus.keras.DistributedOptimizer.
        loss: what `model.compile` takes as its loss (a name, or a Keras loss).
        callbacks: Keras callbacks, run on every rank after hvdplus's broadcast and
            metric-average callbacks.
        metrics: what `model.compile` takes as its metrics; the history gives them per epoch,
            averaged over the ranks, with `val_` in front for the validation rows.
        custom_objects: the classes and functions of your own in the model, optimizer or loss,
            by name, as for `keras.saving.load_model`.
        backend: the Keras backend of the ranks ("tensorflow", "torch" or "jax"); this
            process's when not given.
    """

    def __init__(self, num_proc: Optional[int] = None, model=None, optimizer=None, loss: Any = None, store=None,
                 feature_cols: Sequence[str] = (), label_cols: Sequence[str] = (), batch_size: int = 32,
                 epochs: int = 1, validation=None, callbacks: Sequence[Any] = (), verbose: int = 1,
                 run_id: Optional[str] = None, shuffle: bool = True, random_seed: int = 0,
                 metrics: Optional[Sequence[Any]] = None, custom_objects: Optional[Dict[str, Any]] = None,
                 backend: Optional[str] = None):
        super().__init__(num_proc, model, optimizer, loss, store, feature_cols, label_cols, batch_size, epochs,
                         validation, callbacks, verbose, run_id, shuffle, random_seed)
        self.metrics, self.custom_objects = metrics, dict(custom_objects or {})
        self.backend = backend or keras.backend.backend()

    def _train(self, run_id: str, train_path: str, val_path: Optional[str]) -> "KerasModel":
        self.store.write(self.store.initial_model_path(run_id), model_bytes(self.model))
        optimizer_config = keras.optimizers.serialize(self.optimizer)
        results = run(train_on_rank, args=(optimizer_config, self.loss, self.metrics,
                                           self.custom_objects, self.callbacks, self.store, run_id, train_path,
                                           val_path, self.feature_cols, self.label_cols, self.batch_size,
                                           self.epochs, self.shuffle, self.random_seed, self.verbose),
                      num_proc=self.num_proc, env={"KERAS_BACKEND": self.backend})
        trained = model_from_bytes(results[0]["model"], keras.saving.load_model,
                                   custom_objects=self.custom_objects, compile=False)
        trained.compile(optimizer=keras.optimizers.deserialize(optimizer_config, custom_objects=self.custom_objects),
                        loss=self.loss, metrics=self.metrics)
        return KerasModel(trained, self.feature_cols, self.label_cols, results[0]["history"], run_id,
                          custom_objects=self.custom_objects)


class KerasModel(EstimatorModel):
    """A trained Keras model as a Spark ML Model (see `EstimatorModel`); `getModel()` gives it
    compiled with the estimator's optimizer (fresh), loss and metrics."""

    def __init__(self, model, feature_cols, label_cols, history, run_id, custom_objects=None):
        super().__init__(model, feature_cols, label_cols, history, run_id)
        self._custom_objects = dict(custom_objects or {})

    def _predictor(self):
        return _KerasPredictor(model_bytes(self._model), self._custom_objects)


class _KerasPredictor:
    """The model's outputs for a feature matrix; the model is loaded once per Python worker,
    on that worker's Keras backend."""

    def __init__(self, saved: bytes, custom_objects: Dict[str, Any]):
        self.saved, self.custom_objects, self.model = saved, custom_objects, None

    def __getstate__(self):
        return {**self.__dict__, "model": None}

    def __call__(self, features):
        if self.model is None:
            self.model = model_from_bytes(self.saved, keras.saving.load_model, custom_objects=self.custom_objects,
                                          compile=False)
        return keras.ops.convert_to_numpy(self.model.predict_on_batch(features))
