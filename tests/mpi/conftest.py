"""Every rank of the job runs these tests in the same order; hvdplus is started once per rank.
The fixtures serve tests/mpi/keras/ too."""

import os

import pytest

import hvdplus as hvd

# `pytest tests/mpi/... --ranks N` reads this file in the process that only starts the job.
if os.environ.get("HVDPLUS_MPI_TESTS") == "1":
    hvd.init()

# The Keras suite runs once per backend, named on its own (tests/mpi/keras with KERAS_BACKEND
# set), so the framework-free suites never import keras; the Keras 2 one (tests/mpi/keras2)
# where TF_USE_LEGACY_KERAS=1 makes tf.keras tf_keras.
collect_ignore = ["keras", "keras2"]


@pytest.fixture(scope="module")
def even_and_odd_sets():
    """(this rank's set, the other set) of the even and the odd ranks: added for the module
    that asks for them on every rank, then removed."""
    evens = hvd.add_process_set(range(0, hvd.size(), 2))
    odds = hvd.add_process_set(range(1, hvd.size(), 2))
    yield (evens, odds) if hvd.rank() % 2 == 0 else (odds, evens)
    hvd.remove_process_set(odds)
    hvd.remove_process_set(evens)


@pytest.fixture
def rank():
    return hvd.rank()


@pytest.fixture
def size():
    return hvd.size()

