"""Keras model.fit throughput with hvdplus against the same ranks without communication.

    KERAS_BACKEND=torch      hvdplusrun -np 2 python benchmarks/keras_training.py
    KERAS_BACKEND=tensorflow hvdplusrun -np 2 python benchmarks/keras_training.py
    KERAS_BACKEND=jax        hvdplusrun -np 2 python benchmarks/keras_training.py

For each of the models in keras_models (an 8 x 256 MLP, batch 64 per rank, and a
ResNet-style CNN, batch 32), in one job and one thread per rank: model.fit with hvdplus'
DistributedOptimizer on every rank, the same ranks fitting their own copies with no
communication ("independent ranks"), and one rank alone, taking turns round after round
(harness.interleaved_throughputs). Scaling efficiency = hvdplus / independent ranks. Timed
in steady state, between batch ends inside each fit (see fit_run). Also the naive peer: an
optimizer that all-reduces each gradient with mpi4py, one call each, then divides (no
negotiation, no checks: what the communication alone costs when done plainly), from where
its backend hands the gradients over: eagerly on torch, through one `tf.numpy_function`
inside TensorFlow's tf.function, through one `io_callback` inside JAX's jit. Prints samples/s and the
ratios between them, and writes the same to
benchmarks/results/keras_training_<backend>_np<ranks>.csv (see harness.write_results).
"""

import argparse
import importlib
import os

os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")
# XLA's CPU backend otherwise runs each op on a pool of every core.
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")

import keras  # noqa: E402

import hvdplus.keras as hvd  # noqa: E402
from harness import (add_csv_option, array_batches, fit_runner, interleaved_throughputs,  # noqa: E402
                     mpi4py_average, mpi4py_average_in_place, print_throughput_rows, ratio, throughput_rows,
                     write_results)
from keras_models import MODELS, start_ranks, synthetic_data  # noqa: E402


def fit_run(model, x, y, batch, participants):
    """(run, participants) for harness.interleaved_throughputs: fits timed in steady state
    (see harness.fit_runner)."""
    fit = fit_runner(model, array_batches(x, y, batch))

    def run(n):
        if participants == 1 and hvd.rank() != 0:
            return 0.0, 1  # not taking part: the slowest rank's time is the participant's
        return fit(n)

    return run, participants


def naive_host_average(grads):
    """`grads` (what the backend's optimizer is handed) averaged by mpi4py_average on the host."""
    backend = keras.backend.backend()
    if backend == "torch":  # eager CPU tensors, the variables' own .grad: averaged in place
        mpi4py_average_in_place([grad.numpy() for grad in grads])
        return grads
    if backend == "tensorflow":
        import tensorflow as tf

        averaged = tf.numpy_function(mpi4py_average, grads, [g.dtype for g in grads], stateful=True)
        return [tf.ensure_shape(a, g.shape) for a, g in zip(averaged, grads)]
    import jax
    from jax.experimental import io_callback

    shapes = [jax.ShapeDtypeStruct(g.shape, g.dtype) for g in grads]
    return io_callback(mpi4py_average, shapes, *grads, ordered=True)


class _Mpi4pyAveraging:
    """Mixed in before a Keras optimizer: the naive peer's gradients (naive_host_average)."""

    def apply(self, grads, trainable_variables=None):
        return super().apply(naive_host_average(list(grads)), trainable_variables)


def measure(model, steps, rounds):
    """{label: samples/s} of hvdplus, the naive peer, independent ranks and one rank alone for a BenchmarkModel."""
    x, y = synthetic_data(model, model.batch * steps, seed=hvd.rank())
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    distributed = model.build()
    distributed.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9)), loss=loss)
    alone = model.build()
    alone.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss=loss)
    runs = {"hvdplus": fit_run(distributed, x, y, model.batch, hvd.size())}
    naive = model.build()
    naive_sgd = type("SGD", (_Mpi4pyAveraging, keras.optimizers.SGD), {})
    naive.compile(optimizer=naive_sgd(0.01, momentum=0.9), loss=loss)
    runs["mpi4py loop"] = fit_run(naive, x, y, model.batch, hvd.size())
    runs["independent ranks"] = fit_run(alone, x, y, model.batch, hvd.size())
    runs["one rank alone"] = fit_run(alone, x, y, model.batch, 1)
    return interleaved_throughputs(runs, model.batch, steps, rounds=rounds)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,cnn", help="comma-separated names from keras_models.MODELS")
    parser.add_argument("--steps", type=int, help="steps per fit in each round (default: the model's own)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds in which the runs take turns")
    add_csv_option(parser)
    args = parser.parse_args()
    backend = keras.backend.backend()
    start_ranks(hvd)
    rows = []
    for name in args.models.split(","):
        model = MODELS[name]
        steps = args.steps or model.steps
        results = measure(model, steps, args.rounds)
        ratios = [ratio(results, "hvdplus", "independent ranks"), ratio(results, "mpi4py loop", "independent ranks"),
                  ratio(results, "hvdplus", "mpi4py loop")]
        model_rows = throughput_rows(results, ratios, model=name, batch_per_rank=model.batch, steps=steps)
        if hvd.rank() == 0:
            print(f"Keras {keras.__version__}, backend {backend}, {hvd.size()} ranks, "
                  f"{model.label}, batch {model.batch} per rank; samples/s of all ranks together")
            print_throughput_rows(model_rows)
        rows += model_rows
    write_results(f"keras_training_{backend}", rows,
                  {"keras": keras.__version__, backend: importlib.import_module(backend).__version__}, args.csv)


if __name__ == "__main__":
    main()
