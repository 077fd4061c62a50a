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
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from pyspark.ml import Model
from pyspark.sql import functions
from pyspark.sql.types import ArrayType, DoubleType, StructField, StructType

from ..runner import run
from ..store import Store
from .training import columns_as_array, train_on_rank

__all__ = ["TorchEstimator", "TorchModel"]


class TorchEstimator:
    """Fits a torch model to a DataFrame on `num_proc` ranks, in Horovod's shape.

    Args:
        num_proc: ranks (Spark tasks); Spark's default parallelism when not given.
        model: the torch module to train (its initial weights are the ones it has).
        optimizer: a torch optimizer of `model`'s parameters; each rank makes its own of the same
            class and settings.
        loss: `loss(output, labels)`, a tensor (`torch.nn.functional.cross_entropy`).
        store: where the data and the checkpoints go (`LocalStore(path)`).
        feature_cols: the columns the model reads, concatenated in this order (numbers, arrays,
            or Spark ML vectors).
        label_cols: the label columns; integer labels are class indices (and give `val_accuracy`).
        batch_size: rows per step on each rank.
        epochs: how many epochs the run has in all, those of an earlier fit with the run_id
            included.
        validation: a fraction of the rows to hold out (0.1), or the name of a boolean column
            that marks the validation rows; metrics over them are averaged over the ranks.
        callbacks: unused: accepted for Horovod's signature (the history holds each epoch's
            metrics).
        verbose: 1 prints each epoch's metrics (in task 0's output), 0 nothing.
        run_id: the run's name in the store; a fit under the name of a run with a checkpoint
            resumes from it. A new name when not given.
        shuffle: shuffle each rank's rows every epoch.
        random_seed: the seed of the validation split and the shuffles.
    """

    def __init__(self, num_proc: Optional[int] = None, model=None, optimizer=None, loss: Optional[Callable] = None,
                 store: Optional[Store] = None, feature_cols: Sequence[str] = (), label_cols: Sequence[str] = (),
                 batch_size: int = 32, epochs: int = 1, validation: Union[None, float, str] = None,
                 callbacks: Sequence[Any] = (), verbose: int = 1, run_id: Optional[str] = None,
                 shuffle: bool = True, random_seed: int = 0):
        missing = [name for name, value in (("model", model), ("optimizer", optimizer), ("loss", loss),
                                            ("store", store), ("feature_cols", feature_cols),
                                            ("label_cols", label_cols)) if not value]
        if missing:
            raise ValueError(f"TorchEstimator needs {', '.join(missing)}")
        self.num_proc, self.model, self.optimizer, self.loss, self.store = num_proc, model, optimizer, loss, store
        self.feature_cols, self.label_cols = list(feature_cols), list(label_cols)
        self.batch_size, self.epochs, self.validation = batch_size, epochs, validation
        self.callbacks, self.verbose, self.shuffle, self.random_seed = list(callbacks), verbose, shuffle, random_seed
        self.run_id = run_id

    def fit(self, df) -> "TorchModel":
        """Write `df`'s columns to the store as Parquet, train on them, and return the model."""
        run_id = self._run_id()
        train, validation = self._split(self._columns(df))
        train_path, val_path = self.store.train_data_path(run_id), self.store.val_data_path(run_id)
        # One file per rank at least, in row groups small enough to deal out evenly.
        partitions = max(self.num_proc or df.sparkSession.sparkContext.defaultParallelism, 1)
        train.repartition(partitions).write.mode("overwrite").parquet(self.store.spark_path(train_path))
        if validation is not None:
            validation.repartition(partitions).write.mode("overwrite").parquet(self.store.spark_path(val_path))
        return self._train(run_id, train_path, val_path if validation is not None else None)

    def fit_on_parquet(self, train_path: str, validation_path: Optional[str] = None) -> "TorchModel":
        """Train on Parquet data already written (feature and label columns as `fit` writes them)."""
        return self._train(self._run_id(), train_path, validation_path)

    def _run_id(self) -> str:
        if self.run_id is None:
            self.run_id = f"run-{uuid.uuid4().hex[:8]}"
        return self.run_id

    def _columns(self, df):
        """The feature and label columns (and a validation column), Spark ML vectors as arrays."""
        from pyspark.ml.functions import vector_to_array
        from pyspark.ml.linalg import VectorUDT

        wanted = self.feature_cols + self.label_cols
        if isinstance(self.validation, str):
            wanted.append(self.validation)
        return df.select(*[vector_to_array(df[name]).alias(name) if isinstance(df.schema[name].dataType, VectorUDT)
                           else df[name] for name in wanted])

    def _split(self, df):
        if self.validation is None:
            return df, None
        if isinstance(self.validation, str):
            marked = functions.col(self.validation).cast("boolean")
            return df.filter(~marked).drop(self.validation), df.filter(marked).drop(self.validation)
        fraction = float(self.validation)
        train, validation = df.randomSplit([1.0 - fraction, fraction], seed=self.random_seed)
        return train, validation

    def _train(self, run_id: str, train_path: str, val_path: Optional[str]) -> "TorchModel":
        results = run(train_on_rank, args=(self.model, self.optimizer, self.loss, self.store, run_id, train_path,
                                           val_path, self.feature_cols, self.label_cols, self.batch_size,
                                           self.epochs, self.shuffle, self.random_seed, self.verbose),
                      num_proc=self.num_proc)
        trained = copy.deepcopy(self.model)
        trained.load_state_dict(results[0]["model"])
        return TorchModel(trained, self.feature_cols, self.label_cols, results[0]["history"], run_id)


class TorchModel(Model):
    """A trained torch model as a Spark ML Model: `transform` adds `<label>__output` columns
    (the model's output for each row: a number, or an array of them).

    Args:
        model: the trained torch module.
        feature_cols: the columns it reads.
        label_cols: the labels it was trained for; each names an output column.
        history: each epoch's metrics.
        run_id: the run in the store.
    """

    def __init__(self, model, feature_cols: Sequence[str], label_cols: Sequence[str], history: List[Dict[str, Any]],
                 run_id: str):
        super().__init__()
        self._model, self._feature_cols, self._label_cols = model, list(feature_cols), list(label_cols)
        self._history, self._run_id = history, run_id

    def getModel(self):
        return self._model

    def getHistory(self) -> List[Dict[str, Any]]:
        """Each epoch's metrics: `epoch`, `loss` (the training loss, averaged over the ranks),
        `seconds` (rank 0's time for the epoch's steps), and with validation `val_loss` and, for
        integer labels, `val_accuracy`."""
        return self._history

    def getRunId(self) -> str:
        return self._run_id

    def _transform(self, dataset):
        buffer = io.BytesIO()
        import torch

        torch.save(self._model, buffer)
        weights, features = buffer.getvalue(), self._feature_cols
        outputs = [f"{label}__output" for label in self._label_cols]
        width = self._output_width(dataset)
        kind = ArrayType(DoubleType()) if width > 1 else DoubleType()
        schema = StructType(dataset.schema.fields + [StructField(name, kind) for name in outputs])

        def predict(frames):
            import io

            import torch

            model = torch.load(io.BytesIO(weights), weights_only=False)
            model.eval()
            for frame in frames:
                with torch.no_grad():
                    output = model(torch.from_numpy(columns_as_array(frame, features))).double().numpy()
                for index, name in enumerate(outputs):
                    values = output if len(outputs) == 1 else output[:, index:index + 1]
                    frame[name] = list(values) if width > 1 else values.reshape(-1)
                yield frame

        return dataset.mapInPandas(predict, schema)

    def _output_width(self, dataset) -> int:
        """How many numbers the model gives for a row (of the first row of `dataset`)."""
        import torch

        first = dataset.select(*self._feature_cols).limit(1).toPandas()
        with torch.no_grad():
            output = self._model(torch.from_numpy(columns_as_array(first, self._feature_cols)))
        return int(output.reshape(len(first), -1).shape[1])
