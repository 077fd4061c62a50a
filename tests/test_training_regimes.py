"""The training regimes beyond synchronous data parallelism (local SGD, PeriodicModelAverager,
DiLoCo, DistributedOptimizer(staleness=1)) on real ranks, each against a numpy replay of its
algorithm: the in-rank suite tests/mpi/test_torch_regimes.py, at 2 and 3 ranks, and the Keras 3
one, tests/mpi/keras/test_keras_regimes.py, on each backend. A failure names the test, the rank
and the assertion."""

import importlib.util

import pytest

pytestmark = pytest.mark.mpi

SUITE = "tests/mpi/test_torch_regimes.py"
KERAS_SUITE = "tests/mpi/keras/test_keras_regimes.py"


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("nranks", [2, 3])
def test_torch_regimes_on_ranks(mpi_job, nranks):
    mpi_job.run_pytest_on_ranks(nranks, [SUITE], timeout=360)


@pytest.mark.slow
@pytest.mark.timeout(400)
# tests/test_mpi_suites.py's test_keras_on_each_backend runs the whole Keras directory, this
# suite included, with torch at 3 ranks and tensorflow and jax at 2: here each backend runs it
# at the other size, so that every backend runs it at 2 and 3 ranks.
@pytest.mark.parametrize("backend, nranks", [("torch", 2), ("tensorflow", 3), ("jax", 3)])
def test_keras_regimes_on_ranks(mpi_job, backend, nranks):
    if importlib.util.find_spec("keras") is None or importlib.util.find_spec(backend) is None:
        pytest.skip(f"keras with the {backend} backend is not installed")
    mpi_job.run_pytest_on_ranks(nranks, [KERAS_SUITE], env={"KERAS_BACKEND": backend}, timeout=340)
