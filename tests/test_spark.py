"""hvdplus.spark.run on a real local Spark (`local[2]`): the ranks of one MPI job inside the tasks
of a barrier stage, their return values in rank order, a collective checked against numpy, a
torch DistributedOptimizer equal to one process, a stage Spark cannot place failing within its
timeout, and a raising rank failing the call with its traceback, with no process left behind."""

import os
import subprocess
import sys
import time

import cloudpickle
import numpy as np
import pytest

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")

from pyspark import cloudpickle as spark_cloudpickle  # noqa: E402 (after the check for pyspark)

import hvdplus.spark  # noqa: E402
from hvdplus.runner.python_function import RanksRaisedError  # noqa: E402
from testkit import timing  # noqa: E402
from testkit.processes import assert_all_end  # noqa: E402
from testkit.spark_session import local_session  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(180)]

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")

# Spark's tasks cannot import this module: its functions travel to them by value.
spark_cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def spark():
    session = local_session("local[2]")
    yield session
    session.stop()


def ranks_and_sums(scale):
    import os

    import numpy as np

    import hvdplus as hvd
    hvd.init()
    return hvd.rank(), hvd.size(), os.getpid(), hvd.allreduce(np.arange(4.0) * (hvd.rank() + 1) * scale, op=hvd.Sum)


@pytest.mark.parametrize("num_proc", [1, 2])
def test_each_ranks_return_value_comes_back_in_rank_order(spark, num_proc):
    results = hvdplus.spark.run(ranks_and_sums, args=(3.0,), num_proc=num_proc, start_timeout=60)
    expected = sum(rank + 1 for rank in range(num_proc)) * 3.0 * np.arange(4.0)
    assert [(rank, size) for rank, size, _, _ in results] == [(rank, num_proc) for rank in range(num_proc)]
    for _, _, _, total in results:
        np.testing.assert_array_equal(total, expected)
    assert len({pid for _, _, pid, _ in results}) == num_proc and os.getpid() not in {pid for _, _, pid, _ in results}
    assert_all_end([pid for _, _, pid, _ in results])


def test_num_proc_defaults_to_sparks_parallelism_and_torch_trains_like_one_process(spark):
    torch_shards = pytest.importorskip("testkit.torch_shards")
    torch_shards.register_by_value(cloudpickle, spark_cloudpickle)
    results = hvdplus.spark.run(torch_shards.train_on_shards, args=(torch_shards.model, torch_shards.batches()),
                                start_timeout=60)
    assert len(results) == spark.sparkContext.defaultParallelism == 2
    torch_shards.assert_trains_like_one_process(results, torch_shards.model, torch_shards.batches())


def test_more_ranks_than_spark_has_slots_fail_within_the_timeout(spark):
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"Spark started 0 of the 4 tasks .* within 5 s; .* it has 2 slots"):
        hvdplus.spark.run(ranks_and_sums, args=(1.0,), num_proc=4, start_timeout=5)
    timing.assert_took_under(time.monotonic() - started, 15, quiet=5.2, what="a start past Spark's slots failing")
    # Spark is free again: the next job runs.
    assert [rank for rank, _, _, _ in hvdplus.spark.run(ranks_and_sums, args=(1.0,), num_proc=2)] == [0, 1]


def test_a_rank_that_raises_fails_the_call_with_its_traceback(spark, tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()

    def fail_on_rank_1(folder):
        import os
        import time

        import hvdplus as hvd
        hvd.init()
        open(os.path.join(folder, str(os.getpid())), "w").close()
        if hvd.rank() == 1:
            raise ValueError("rank 1 gives up")
        time.sleep(60)

    started = time.monotonic()
    with pytest.raises(RanksRaisedError, match="rank 1 gives up") as raised:
        hvdplus.spark.run(fail_on_rank_1, args=(str(pids),), num_proc=2, start_timeout=60)
    timing.assert_took_under(time.monotonic() - started, 30, quiet=7.5, what="a Spark job ending after rank 1 raised")
    assert list(raised.value.failures) == [1] and "fail_on_rank_1" in raised.value.failures[1].traceback
    assert_all_end([int(pid) for pid in os.listdir(pids)])


def test_torch_estimator_learns_the_digits_from_a_dataframe_and_resumes_from_the_store(spark, tmp_path):
    import torch

    from hvdplus.spark.store import LocalStore
    from hvdplus.spark.torch import TorchEstimator

    sys.path.insert(0, EXAMPLES)
    from spark_torch_estimator import digits_frames  # the example's split: a quarter for testing

    train, test = digits_frames(spark)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    store = LocalStore(str(tmp_path / "store"))

    def estimator(epochs):
        return TorchEstimator(num_proc=2, model=net, optimizer=torch.optim.Adam(net.parameters(), lr=0.01),
                              loss=torch.nn.functional.cross_entropy, store=store, feature_cols=["features"],
                              label_cols=["label"], batch_size=32, epochs=epochs, validation=0.1, run_id="digits",
                              verbose=0)

    first = estimator(2).fit(train)
    assert [metrics["epoch"] for metrics in first.getHistory()] == [1, 2]
    # The same run, to 5 epochs: it goes on from the checkpoint of epoch 2 in the store.
    model = estimator(5).fit(train)
    history = model.getHistory()
    assert [metrics["epoch"] for metrics in history] == [1, 2, 3, 4, 5] and history[:2] == first.getHistory()
    assert history[-1]["loss"] < history[0]["loss"] and history[-1]["val_accuracy"] >= 0.85, history
    predicted = model.transform(test).toPandas()
    assert list(predicted.columns) == ["features", "label", "label__output"]
    accuracy = (np.stack(predicted["label__output"]).argmax(axis=1) == predicted["label"]).mean()
    assert accuracy >= 0.9, accuracy
    # getModel gives the trained torch module: its predictions are the column's.
    features = torch.tensor(np.stack(predicted["features"]), dtype=torch.float32)
    with torch.no_grad():
        np.testing.assert_allclose(model.getModel()(features).numpy(), np.stack(predicted["label__output"]),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.timeout(300)
def test_the_torch_estimator_example_learns_the_digits_and_ends_quietly(tmp_path):
    # A Spark of its own, as a user's run of the example starts: its Python workers write to its stderr.
    # It takes about 85 s beside the suite's other worker, and 150 s on a busier machine.
    result = subprocess.run([sys.executable, os.path.join(EXAMPLES, "spark_torch_estimator.py"), "--store",
                             str(tmp_path / "store")], capture_output=True, text=True, timeout=270)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert float(result.stdout.split("test accuracy")[1].split()[0]) >= 0.9, output[-6000:]
    # No Python worker was cut off mid-output (a traceback of pyspark's daemon), and the pandas
    # installed is one that pyspark supports.
    assert "Traceback" not in output and "does not yet fully support pandas" not in output, output[-6000:]


def test_the_spark_run_example_learns_the_digits_on_every_rank(spark):
    sys.path.insert(0, EXAMPLES)
    import spark_run

    spark_cloudpickle.register_pickle_by_value(spark_run)  # the tasks cannot import examples/
    results = hvdplus.spark.run(spark_run.train, args=(200, 0.5), num_proc=2)
    assert [rank for rank, _ in results] == [0, 1]
    # Every rank took the same steps from the summed gradients: the same model, the same accuracy.
    assert results[0][1] == results[1][1] >= 0.9, results


@pytest.mark.parametrize("backend,first_epochs", [("tensorflow", 0), ("torch", 2)])
def test_keras_estimator_learns_the_digits_on_each_backend_and_resumes_from_the_store(spark, tmp_path, backend,
                                                                                     first_epochs):
    import keras

    from hvdplus.spark.keras import KerasEstimator
    from hvdplus.spark.store import LocalStore

    sys.path.insert(0, EXAMPLES)
    from spark_keras_estimator import digits_frames, digits_model

    train, test = digits_frames(spark)
    store = LocalStore(str(tmp_path / "store"))

    def estimator(epochs):
        return KerasEstimator(num_proc=2, model=digits_model(), optimizer=keras.optimizers.Adam(0.01),
                              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
                              store=store, feature_cols=["features"], label_cols=["label"], batch_size=32,
                              epochs=epochs, validation=0.1, run_id="digits", verbose=0, backend=backend)

    first = estimator(first_epochs).fit(train) if first_epochs else None
    model = estimator(5).fit(train)
    history = model.getHistory()
    assert [metrics["epoch"] for metrics in history] == [1, 2, 3, 4, 5]
    if first is not None:  # the second fit went on from the checkpoint of the first's last epoch
        assert history[:first_epochs] == first.getHistory()
    assert history[-1]["loss"] < history[0]["loss"] and history[-1]["val_accuracy"] >= 0.85, history
    predicted = model.transform(test).toPandas()
    assert list(predicted.columns) == ["features", "label", "label__output"]
    accuracy = (np.stack(predicted["label__output"]).argmax(axis=1) == predicted["label"]).mean()
    assert accuracy >= 0.9, accuracy
    # getModel gives the trained Keras model: its predictions are the column's.
    np.testing.assert_allclose(model.getModel().predict_on_batch(np.stack(predicted["features"]).astype(np.float32)),
                               np.stack(predicted["label__output"]), rtol=1e-4, atol=1e-4)
