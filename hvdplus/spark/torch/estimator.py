"""`TorchEstimator`: fit a torch model to a Spark DataFrame with hvdplus, as a Spark ML estimator.

    from hvdplus.spark.store import LocalStore
    from hvdplus.spark.torch import TorchEstimator

    estimator = TorchEstimator(num_proc=2, model=net, optimizer=torch.optim.Adam(net.parameters()),
                               loss=torch.nn.functional.cross_entropy, store=LocalStore("/tmp/store"),
                               feature_cols=["features"], label_cols=["label"], batch_size=32, epochs=10,
                               validation=0.1)
    model = estimator.fit(train_df)              # a TorchModel, a Spark ML Model
    predictions = model.transform(test_df)        # adds "label__output"
    net = model.getModel()

`fit` writes the DataFrame's feature and label columns as Parquet into the store, then trains
through `hvdplus.spark.run`: every rank reads its share of the row groups with pyarrow
(hvdplus.spark.torch.training). After each epoch rank 0 keeps a checkpoint in the store, and a
later `fit` with the same `run_id` goes on from it.
"""

import copy
import io
from typing import Optional

from ..estimator import Estimator, EstimatorModel
from ..runner import run
from .training import train_on_rank

__all__ = ["TorchEstimator", "TorchModel"]


class TorchEstimator(Estimator):
    """Fits a torch model to a DataFrame on `num_proc` ranks, in Horovod's shape; the arguments
    are those of `hvdplus.spark.estimator.Estimator`, with

    Args:
        model: the torch module to train.
        optimizer: a torch optimizer of `model`'s parameters; each rank makes its own of the same
            class and settings.
        loss: `loss(output, labels)`, a tensor (`torch.nn.functional.cross_entropy`).
        callbacks: unused: accepted for Horovod's signature (the history holds each epoch's
            metrics).

    The history's validation metrics are `val_loss` and, for integer labels, `val_accuracy`.
    """

    def _train(self, run_id: str, train_path: str, val_path: Optional[str]) -> "TorchModel":
        import torch

        saved = io.BytesIO()
        torch.save(self.model, saved)
        self.store.write(self.store.initial_model_path(run_id), saved.getvalue())
        results = run(train_on_rank, args=(type(self.optimizer), self.optimizer.defaults, self.loss, self.store,
                                           run_id, train_path, val_path, self.feature_cols, self.label_cols,
                                           self.batch_size, self.epochs, self.shuffle, self.random_seed,
                                           self.verbose),
                      num_proc=self.num_proc)
        trained = copy.deepcopy(self.model)
        trained.load_state_dict(results[0]["model"])
        return TorchModel(trained, self.feature_cols, self.label_cols, results[0]["history"], run_id)


class TorchModel(EstimatorModel):
    """A trained torch model as a Spark ML Model (see `EstimatorModel`)."""

    def _predictor(self):
        import torch

        buffer = io.BytesIO()
        torch.save(self._model, buffer)
        return _TorchPredictor(buffer.getvalue())


class _TorchPredictor:
    """The model's outputs for a feature matrix; the model is loaded once per Python worker."""

    def __init__(self, saved: bytes):
        self.saved, self.model = saved, None

    def __getstate__(self):
        return {**self.__dict__, "model": None}

    def __call__(self, features):
        import torch

        if self.model is None:
            self.model = torch.load(io.BytesIO(self.saved), weights_only=False)
            self.model.eval()
        with torch.no_grad():
            return self.model(torch.from_numpy(features)).double().numpy()
