"""What the Spark estimators share: Horovod's estimator shape (`fit(df)` writes the DataFrame
to the store as Parquet and trains on it through `hvdplus.spark.run`), and the trained model as
a Spark ML `Model` whose `transform` adds the model's outputs as columns.

A framework's estimator (hvdplus.spark.torch, hvdplus.spark.keras) says only how its ranks train
(`_train`) and how a trained model predicts (`_predictor`).
"""

import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import numpy as np
from pyspark.ml import Model
from pyspark.sql import functions
from pyspark.sql.types import ArrayType, DoubleType, StructField, StructType

from .data import columns_as_array, read_first_features
from .store import Store

__all__ = ["Estimator", "EstimatorModel"]


class Estimator:
    """Fits a model to a DataFrame on `num_proc` ranks.

    Args:
        num_proc: ranks (Spark tasks); Spark's default parallelism when not given.
        model: the model to train (its initial weights are the ones it has).
        optimizer: the optimizer; each rank makes its own of the same class and settings.
        loss: the loss.
        store: where the data and the checkpoints go (`LocalStore(path)`).
        feature_cols: the columns the model reads, concatenated in this order (numbers, arrays,
            or Spark ML vectors).
        label_cols: the label columns; integer labels are class indices.
        batch_size: rows per step on each rank.
        epochs: how many epochs the run has in all, those of an earlier fit with the run_id
            included.
        validation: a fraction of the rows to hold out (0.1), or the name of a boolean column
            that marks the validation rows; metrics over them are averaged over the ranks.
        callbacks: the framework's callbacks, where it has them.
        verbose: 1 prints each epoch's metrics (in task 0's output), 0 nothing.
        run_id: the run's name in the store; a fit under the name of a run with a checkpoint
            resumes from it. A new name when not given.
        shuffle: shuffle each rank's rows every epoch.
        random_seed: the seed of the validation split, the shuffles and the ranks' generators.
    """

    def __init__(self, num_proc: Optional[int] = None, model=None, optimizer=None, loss: Any = None,
                 store: Optional[Store] = None, feature_cols: Sequence[str] = (), label_cols: Sequence[str] = (),
                 batch_size: int = 32, epochs: int = 1, validation: Union[None, float, str] = None,
                 callbacks: Sequence[Any] = (), verbose: int = 1, run_id: Optional[str] = None,
                 shuffle: bool = True, random_seed: int = 0):
        missing = [name for name, value in (("model", model), ("optimizer", optimizer), ("loss", loss),
                                            ("store", store), ("feature_cols", feature_cols),
                                            ("label_cols", label_cols)) if not value]
        if missing:
            raise ValueError(f"{type(self).__name__} needs {', '.join(missing)}")
        self.num_proc, self.model, self.optimizer, self.loss, self.store = num_proc, model, optimizer, loss, store
        self.feature_cols, self.label_cols = list(feature_cols), list(label_cols)
        self.batch_size, self.epochs, self.validation = batch_size, epochs, validation
        self.callbacks, self.verbose, self.shuffle, self.random_seed = list(callbacks), verbose, shuffle, random_seed
        self.run_id = run_id

    def fit(self, df) -> "EstimatorModel":
        """Write `df`'s columns to the store as Parquet, train on them, and return the model."""
        run_id = self._run_id()
        train, validation = self._split(self._columns(df))
        train_path, val_path = self.store.train_data_path(run_id), self.store.val_data_path(run_id)
        # One file per rank at least, in row groups small enough to deal out evenly.
        partitions = max(self.num_proc or df.sparkSession.sparkContext.defaultParallelism, 1)
        train.repartition(partitions).write.mode("overwrite").parquet(self.store.spark_path(train_path))
        if validation is not None:
            validation.repartition(partitions).write.mode("overwrite").parquet(self.store.spark_path(val_path))
        return self._fit(run_id, train_path, val_path if validation is not None else None)

    def fit_on_parquet(self, train_path: str, validation_path: Optional[str] = None) -> "EstimatorModel":
        """Train on Parquet data already written (feature and label columns as `fit` writes them)."""
        return self._fit(self._run_id(), train_path, validation_path)

    def _fit(self, run_id: str, train_path: str, val_path: Optional[str]) -> "EstimatorModel":
        model = self._train(run_id, train_path, val_path)
        model._learn_output_width(read_first_features(train_path, self.feature_cols))
        return model

    def _train(self, run_id: str, train_path: str, val_path: Optional[str]) -> "EstimatorModel":
        raise NotImplementedError

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


class EstimatorModel(Model):
    """A trained model as a Spark ML Model: `transform` adds `<label>__output` columns (the
    model's output for each row: a number, or an array of them).

    Args:
        model: the trained framework model.
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
        self._output_width: Optional[int] = None  # learned by the estimator's fit

    def getModel(self):
        return self._model

    def getHistory(self) -> List[Dict[str, Any]]:
        """Each epoch's metrics: `epoch`, `loss` (the training loss, averaged over the ranks),
        `seconds` (rank 0's time for the epoch), and with validation `val_loss` and the
        framework's validation metrics."""
        return self._history

    def getRunId(self) -> str:
        return self._run_id

    def _predictor(self) -> Callable[[np.ndarray], np.ndarray]:
        """A picklable function from a float32 feature matrix to the model's outputs, one row
        each; it runs in Spark's executors."""
        raise NotImplementedError

    def _learn_output_width(self, features: np.ndarray) -> None:
        """How many numbers the model gives for a row, from its output for `features` (rows of
        the training data): `transform` declares its columns with it, since a query of the
        DataFrame's first row would cut off the Python workers its rows may come from (local
        rows, a Python UDF), each cut a BrokenPipeError traceback of pyspark's daemon."""
        self._output_width = int(np.asarray(self._predictor()(features)).reshape(len(features), -1).shape[1])

    def _transform(self, dataset):
        predict_rows, features, width = self._predictor(), self._feature_cols, self._output_width
        if width is None:  # a model no fit of this process made: its output for the first row says
            first = dataset.select(*features).limit(1).toPandas()
            width = int(predict_rows(columns_as_array(first, features)).reshape(len(first), -1).shape[1])
        outputs = [f"{label}__output" for label in self._label_cols]
        kind = ArrayType(DoubleType()) if width > 1 else DoubleType()
        schema = StructType(dataset.schema.fields + [StructField(name, kind) for name in outputs])

        def predict(frames):
            for frame in frames:
                output = np.asarray(predict_rows(columns_as_array(frame, features)), dtype=np.float64)
                output = output.reshape(len(frame), -1)
                for index, name in enumerate(outputs):
                    values = output if len(outputs) == 1 else output[:, index:index + 1]
                    frame[name] = list(values) if width > 1 else values.reshape(-1)
                yield frame

        return dataset.mapInPandas(predict, schema)
