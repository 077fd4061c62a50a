"""Runs the suites under tests/mpi/ inside real MPI jobs of 1, 2, 3 and 4 ranks (odd sizes
catch ring and split arithmetic), a job per file, the topology suite with ranks posing as
nodes, and the Keras suites once per Keras backend and under Keras 2. A failure names the
file, the test, the rank and the assertion (tests/testkit/rank_reports.py)."""

import glob
import importlib.util
import os
import re

import pytest

from testkit.mpi_jobs import REPO
from testkit.programs import program

pytestmark = pytest.mark.mpi


# Suites that a test file of their own runs (tests/test_training_regimes.py, tests/test_zero.py,
# tests/test_compression.py), at the sizes it names.
RUN_ELSEWHERE = {"tests/mpi/test_torch_regimes.py", "tests/mpi/test_torch_zero.py",
                 "tests/mpi/test_torch_zero_resize.py", "tests/mpi/test_torch_compression.py"}
MPI_SUITES = sorted(suite for suite in (os.path.relpath(path, REPO) for path in
                                        glob.glob(os.path.join(REPO, "tests", "mpi", "test_*.py")))
                    if suite not in RUN_ELSEWHERE)


TF_SUITES = [suite for suite in MPI_SUITES if os.path.basename(suite).startswith("test_tf_")]
TORCH_SUITES = [suite for suite in MPI_SUITES if os.path.basename(suite).startswith("test_torch_")]
# The quick tier (`-m "not slow"`) keeps the framework-free suites that run in seconds, at the
# odd size: the core's collectives, engine, errors, algorithms, process sets and topology.
QUICK_SUITES = {f"tests/mpi/test_{name}.py" for name in
                ("collectives", "engine", "errors", "algorithms", "process_sets", "topology")}
# The framework-free suites a job per file. The frameworks' suites run in a job per size below:
# each rank pays the framework's import (seconds where three ranks share two cores) once.
SUITE_JOBS = [pytest.param(suite, nranks, marks=pytest.mark.quick) if (suite in QUICK_SUITES and nranks == 3)
              else (suite, nranks) for suite in MPI_SUITES if suite not in TF_SUITES + TORCH_SUITES
              for nranks in (2, 3)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("suite, nranks", SUITE_JOBS, ids=lambda value: str(value) if isinstance(value, int)
                         else os.path.basename(value))
def test_suite_on_ranks(mpi_job, suite, nranks):
    # One job per file; a failure names its file, test and rank.
    mpi_job.run_pytest_on_ranks(nranks, [suite])


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("nranks", [2, 3])
def test_torch_suites_on_ranks(mpi_job, nranks):
    # A failure names its file, test and rank.
    mpi_job.run_pytest_on_ranks(nranks, TORCH_SUITES, timeout=560)


# The jobs that run tests/mpi/test_algorithms.py again under other settings take its grid of
# pairs (see there): the whole grid runs at 2 and 3 ranks.
PAIRS = {"HVDPLUS_TEST_GRID": "pairs"}


# TensorFlow's suites at 3 ranks only (and at 1, below): its bridge does the same at every
# size, and two of its ranks reach the engine as the core's and torch's suites do at 2.
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tensorflow_suites_on_three_ranks(mpi_job):
    mpi_job.run_pytest_on_ranks(3, TF_SUITES, timeout=560)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_suite_on_one_rank(mpi_job):
    # At one rank every collective takes its shortcut; one job for all the files pays the
    # frameworks' imports once.
    mpi_job.run_pytest_on_ranks(1, MPI_SUITES, env=PAIRS)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "nranks, ranks_per_node", [(4, 2), (3, 2)], ids=["4-ranks-as-2x2", "3-ranks-as-2+1"]
)
def test_topology_with_simulated_nodes(mpi_job, nranks, ranks_per_node):
    mpi_job.run_pytest_on_ranks(
        nranks, ["tests/mpi/test_topology.py"], env={"HVDPLUS_RANKS_PER_NODE": str(ranks_per_node)}
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_collectives_with_tiny_fusion_buffer_no_response_cache_and_overlap(mpi_job):
    # Every fused batch splits and every name negotiates in full: the paths steady state skips.
    # Overlap on: collectives run in the background at once (auto picks off on this machine);
    # single copy off: large shared-memory all-reduces stage through the window instead.
    # Four ranks, a power of two beside the odd three of the defaults (Adasum runs here), two
    # to a core. The framework-free suites: the adapters reach the engine through the same
    # calls, and their suites run at 1 to 3 ranks under the defaults below (MPICH's at 4).
    framework_free = [path for path in MPI_SUITES if not os.path.basename(path).startswith(("test_tf_", "test_torch_"))]
    mpi_job.run_pytest_on_ranks(
        4, framework_free,
        env={"HVDPLUS_FUSION_THRESHOLD": "1000", "HVDPLUS_CACHE_CAPACITY": "0", "HVDPLUS_OVERLAP": "on",
             "HVDPLUS_SINGLE_COPY": "0", **PAIRS},
    )


@pytest.mark.timeout(300)
def test_engine_packing_groups_on_two_ranks(mpi_job):
    # With MPI as the engine's algorithm nothing is reduced where it lies: groups are packed,
    # and a packed Average over two ranks is applied while packing.
    mpi_job.run_pytest_on_ranks(2, ["tests/mpi/test_engine.py"], env={"HVDPLUS_ALLREDUCE_ALGO": "mpi"})


@pytest.mark.timeout(300)
def test_engine_and_optimizer_with_overlap_on_two_ranks(mpi_job):
    mpi_job.run_pytest_on_ranks(2, ["tests/mpi/test_engine.py", "tests/mpi/test_torch_optimizer.py"],
                                env={"HVDPLUS_OVERLAP": "on"})


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "nranks, ranks_per_node",
    [(4, 0), (4, 2), (3, 2), (6, 2), (3, 1)],
    ids=["4-ranks-one-node", "2x2-nodes", "2+1-uneven-nodes", "3x2-nodes", "3x1-nodes"],
)
def test_algorithms_with_simulated_nodes(mpi_job, nranks, ranks_per_node):
    # 0 means no simulation: every rank on this machine's one node.
    mpi_job.run_pytest_on_ranks(
        nranks, ["tests/mpi/test_algorithms.py"], env={"HVDPLUS_RANKS_PER_NODE": str(ranks_per_node), **PAIRS}
    )


@pytest.mark.timeout(400)
# One job size a backend, odd and even among them: the ranks' arithmetic is the core's,
# which its own suites run at every size.
# (tests/test_training_regimes.py runs test_keras_regimes.py at each backend's other size.)
@pytest.mark.parametrize("backend, nranks", [("torch", 3), ("tensorflow", 2), ("jax", 2)])
def test_keras_on_each_backend(mpi_job, backend, nranks):
    if importlib.util.find_spec("keras") is None or importlib.util.find_spec(backend) is None:
        pytest.skip(f"keras with the {backend} backend is not installed")
    mpi_job.run_pytest_on_ranks(nranks, ["tests/mpi/keras"], env={"KERAS_BACKEND": backend}, timeout=380)


# Where TF_USE_LEGACY_KERAS=1 makes tf.keras tf_keras (Keras 2): the Keras 2 suite, and the
# TensorFlow suites' tests that build on tf.keras layers (tf_keras' have tf.Variables, keyed by
# .ref(), and a fused kernel). At 2 ranks only: the rest of the TensorFlow adapter runs alike
# whichever Keras is there, at 1 and 3 ranks above.
KERAS_2_TESTS = ["tests/mpi/keras2",
                 "tests/mpi/test_tf_tape.py::test_partial_tape_keeps_local_layers_gradients_and_scales_them",
                 "tests/mpi/test_tf_tape.py::test_sync_batch_normalization_normalizes_with_the_global_batch"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tensorflow_with_keras_2_on_two_ranks(mpi_job):
    pytest.importorskip("tf_keras")
    mpi_job.run_pytest_on_ranks(2, KERAS_2_TESTS, env={"TF_USE_LEGACY_KERAS": "1"})


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ranks_per_node, algorithm", [(0, "auto"), (2, "auto"), (2, "ring")],
                         ids=["one-node", "2x2-nodes", "2x2-nodes-ring"])
def test_process_sets_in_a_job_of_four(mpi_job, ranks_per_node, algorithm):
    # Sets of 1, 2 and 3 ranks side by side, which 3 ranks cannot hold; on posed nodes the
    # set of ranks 0-2 spans them unevenly (2 + 1).
    env = {"HVDPLUS_RANKS_PER_NODE": str(ranks_per_node), "HVDPLUS_ALLREDUCE_ALGO": algorithm}
    mpi_job.run_pytest_on_ranks(4, ["tests/mpi/test_process_sets.py"], env=env)


@pytest.mark.timeout(400)
def test_torch_process_sets_and_load_balance_in_a_job_of_four(mpi_job):
    # The PyTorch adapter on sets of 1, 2 and 3 ranks side by side; the balancer and the
    # weighted gradients at a fourth size, in the job that has already paid torch's import.
    mpi_job.run_pytest_on_ranks(4, ["tests/mpi/test_torch_process_sets.py", "tests/mpi/test_load_balance.py",
                                    "tests/mpi/test_torch_load_balance.py"], timeout=360)


@pytest.mark.timeout(120)
def test_point_to_point_with_a_dead_peer_raises_ranks_failed(mpi_job):
    # Elastic mode runs MPI with failure mitigation: rank 2 dies while rank 0 waits for its
    # message and rank 1 for its acknowledgement; neither may hang.
    result = mpi_job(3, program("p2p_with_a_dead_peer"), launcher_args=["--min-np", "1"], timeout=90)
    # A rank that learns of the death from the others' revoking may not know who died yet.
    for line in (r"rank 0: recv from rank 2 with tag 0: (ranks \[2\]|a rank) of the 3-rank job failed",
                 r"rank 1: send to rank 2 with tag 0: (ranks \[2\]|a rank) of the 3-rank job failed"):
        assert re.search(line, result.stdout), result.stdout[-4000:] + result.stderr[-4000:]


@pytest.mark.timeout(300)
def test_pipeline_of_two_stages_times_two_replicas(mpi_job):
    # Pipelines of 4 stages, and 2 stages x 2 data-parallel replicas, need 4 ranks.
    mpi_job.run_pytest_on_ranks(4, ["tests/mpi/test_torch_pipeline.py", "tests/mpi/test_torch_parallel.py"])
