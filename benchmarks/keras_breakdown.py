"""Where a Keras training step's time goes with hvdplus, on the communication-bound MLP.

    KERAS_BACKEND=tensorflow hvdplusrun -np 2 python benchmarks/keras_breakdown.py
    KERAS_BACKEND=jax        hvdplusrun -np 2 python benchmarks/keras_breakdown.py
    KERAS_BACKEND=torch      hvdplusrun -np 2 python benchmarks/keras_breakdown.py

model.fit of keras_models' MLP (batch 64 per rank) in five ways, taking turns round after
round in one job (harness.interleaved_throughputs), each way a model of its own:

- "compute": the ranks fit their own copies, with no hvdplus at all;
- "bridge": hvdplus' DistributedOptimizer, whose host function hands the gradients straight
  back instead of reducing them: the step's crossing from the framework to numpy and back
  (TensorFlow's numpy_function, the host between JAX's two compiled halves, torch's tensors
  as arrays), nothing else;
- "bridge + lock-step": the same, with an MPI Barrier where the all-reduce would be: what
  the ranks lose by waiting for each other every step, with no data moved;
- "bridge + raw MPI": the crossing, with one mpi4py `Allreduce` of the step's gradients
  packed into one persistent buffer, and the average: the fastest all-reduce of the same
  bytes from inside this framework's step, the ceiling of any library that bridges to the
  host;
- "hvdplus": the real thing (negotiation, checks, fusion, the engine's algorithms).

The differences between consecutive ways, per step, are the costs of the bridge, of the
lock-step, of moving the data and of hvdplus' engine beyond a raw call. The host function is swapped by
replacing the `collectives` module that the backend's bridge calls for the duration of a
way's fits (it is looked up per call, so the compiled steps stay as they are). Prints
milliseconds per step, and writes benchmarks/results/keras_breakdown_<backend>_np<ranks>.csv.
"""

import argparse
import contextlib
import importlib
import os

os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import hvdplus.keras as hvd  # noqa: E402
from hvdplus.common.packed_members import members_of  # noqa: E402
from harness import add_csv_option, array_batches, fit_runner, interleaved_throughputs, write_results  # noqa: E402
from keras_models import MODELS, start_ranks, synthetic_data  # noqa: E402

WORLD = MPI.COMM_WORLD
# The module whose `collectives` each backend's bridge calls on the host.
BRIDGE_MODULES = {"tensorflow": "hvdplus.tensorflow.mpi_ops", "jax": "hvdplus.keras.backends.jax",
                  "torch": "hvdplus.torch.mpi_ops"}


class _Done:
    """A finished handle: what the bridge's `.wait()` expects."""

    def __init__(self, result):
        self._result = result

    def wait(self):
        return self._result

    def then(self, step):
        return _Done(step(self._result))


class _HandsBack:
    """Stands in for hvdplus.core.collectives in the bridge: every member comes back as it went."""

    def grouped_allreduce_async(self, arrays, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                                outputs=None, process_set=None):
        arrays = [np.asarray(array) for array in arrays]
        if outputs is None:
            return _Done(arrays)
        for array, output in zip(arrays, outputs):
            if output is not array:
                np.copyto(output, array)
        return _Done(list(outputs))


class _LockStep(_HandsBack):
    """The members handed back after an MPI Barrier: the ranks meet, no data moves."""

    def grouped_allreduce_async(self, arrays, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                                outputs=None, process_set=None):
        WORLD.Barrier()
        return super().grouped_allreduce_async(arrays, outputs=outputs)


class _RawMpi(_HandsBack):
    """One mpi4py Allreduce of all members packed into one buffer that every step reuses (MPI
    moves a buffer it has seen before fastest), then the average."""

    def __init__(self):
        self._packed = np.empty(0, np.float32)

    def grouped_allreduce_async(self, arrays, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                                outputs=None, process_set=None):
        arrays = [np.asarray(array) for array in arrays]
        total = sum(array.size for array in arrays)
        if self._packed.size != total or self._packed.dtype != arrays[0].dtype:
            self._packed = np.empty(total, arrays[0].dtype)
        packed, start = self._packed, 0
        for array in arrays:
            packed[start:start + array.size] = array.reshape(-1)
            start += array.size
        WORLD.Allreduce(MPI.IN_PLACE, packed)
        packed *= postscale_factor / WORLD.Get_size()
        if outputs is None:  # views of the packed buffer, as the engine hands out its own
            return _Done(members_of(packed, [array.shape for array in arrays]))
        for output, member in zip(outputs, members_of(packed, [array.shape for array in arrays])):
            np.copyto(output, member)
        return _Done(list(outputs))


@contextlib.contextmanager
def bridge_calls(stand_in):
    """The backend's bridge calls `stand_in` instead of the core's collectives, for now."""
    module = importlib.import_module(BRIDGE_MODULES[keras.backend.backend()])
    real = module.collectives
    if stand_in is not None:
        module.collectives = stand_in
    try:
        yield
    finally:
        module.collectives = real


def way(model, x, y, batch, stand_in=None):
    """(run, participants) for interleaved_throughputs: fits with the bridge as `stand_in` says."""
    fit = fit_runner(model, array_batches(x, y, batch))

    def run(n):
        with bridge_calls(stand_in):
            return fit(n)

    return run, hvd.size()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="steps per fit in each round")
    parser.add_argument("--rounds", type=int, default=7)
    add_csv_option(parser)
    args = parser.parse_args()
    backend = keras.backend.backend()
    start_ranks(hvd)
    spec = MODELS["mlp"]
    x, y = synthetic_data(spec, spec.batch * args.steps, seed=hvd.rank())
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def compiled(distributed):
        model = spec.build()
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
        model.compile(optimizer=hvd.DistributedOptimizer(optimizer) if distributed else optimizer, loss=loss)
        return model

    runs = {
        "compute": way(compiled(False), x, y, spec.batch),
        "bridge": way(compiled(True), x, y, spec.batch, _HandsBack()),
        "bridge + lock-step": way(compiled(True), x, y, spec.batch, _LockStep()),
        "bridge + raw MPI": way(compiled(True), x, y, spec.batch, _RawMpi()),
        "hvdplus": way(compiled(True), x, y, spec.batch),
    }
    samples = interleaved_throughputs(runs, spec.batch, args.steps, rounds=args.rounds)
    # samples/s of all ranks together -> milliseconds per step of each rank.
    step_ms = {label: 1e3 * spec.batch * hvd.size() / value for label, value in samples.items()}
    labels = list(runs)
    rows = []
    for index, label in enumerate(labels):
        added = step_ms[label] - step_ms[labels[index - 1]] if index else None
        rows.append({"model": "mlp", "batch_per_rank": spec.batch, "way": label,
                     "samples_per_s": samples[label], "ms_per_step": step_ms[label],
                     "ms_added": added, "efficiency": samples[label] / samples["compute"]})
    if hvd.rank() == 0:
        print(f"Keras {keras.__version__}, backend {backend}, {hvd.size()} ranks, MLP, batch {spec.batch} per rank")
        for row in rows:
            added = "" if row["ms_added"] is None else f"  (+{row['ms_added']:.2f} ms)"
            print(f"  {row['way']:18s} {row['ms_per_step']:7.2f} ms/step  {row['samples_per_s']:8.0f} samples/s  "
                  f"efficiency {row['efficiency']:.2f}{added}")
    write_results(f"keras_breakdown_{backend}", rows,
                  {"keras": keras.__version__, backend: importlib.import_module(backend).__version__}, args.csv)


if __name__ == "__main__":
    main()
