"""init/shutdown and the queries, in this process (a job of one) and in small real jobs."""

import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import hvdplus as hvd

from testkit import timing
from testkit.programs import program

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUERIES = [
    hvd.size, hvd.rank, hvd.local_size, hvd.local_rank, hvd.cross_size, hvd.cross_rank,
    hvd.is_homogeneous, hvd.mpi_threads_supported, hvd.mpi_enabled,
]
COLLECTIVES = [
    lambda: hvd.allreduce(np.ones(2)), lambda: hvd.allgather(np.ones(2)),
    lambda: hvd.broadcast(np.ones(2), 0), lambda: hvd.alltoall(np.ones(2)),
    lambda: hvd.reducescatter(np.ones(2)), hvd.barrier,
    lambda: hvd.broadcast_object(1), lambda: hvd.allgather_object(1),
]


@pytest.fixture
def uninitialized():
    hvd.shutdown()
    yield
    hvd.shutdown()


@pytest.mark.parametrize("call", QUERIES + COLLECTIVES)
def test_everything_before_init_raises_a_clear_error(call, uninitialized):
    with pytest.raises(hvd.NotInitializedError, match=r"hvdplus has not been initialized; call hvdplus.init\(\) first"):
        call()
    assert not hvd.is_initialized()


def test_single_process_is_a_job_of_one(uninitialized):
    hvd.init()
    hvd.init()  # twice is harmless
    assert hvd.is_initialized()
    assert (hvd.size(), hvd.rank(), hvd.local_size(), hvd.local_rank()) == (1, 0, 1, 0)
    assert (hvd.cross_size(), hvd.cross_rank(), hvd.is_homogeneous()) == (1, 0, True)
    assert hvd.mpi_enabled() and hvd.mpi_built()
    np.testing.assert_array_equal(hvd.allreduce(np.arange(3.0)), np.arange(3.0))


@pytest.mark.parametrize("module", ["hvdplus", "hvdplus.torch"])
def test_horovods_build_queries_answer_before_init(module, uninitialized):
    adapter = pytest.importorskip(module)
    assert adapter.nccl_built() == 0 and adapter.mpi_built()
    for query in ("gloo_built", "gloo_enabled", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "sycl_built"):
        assert getattr(adapter, query)() is False


@pytest.mark.parametrize("module", ["hvdplus", "hvdplus.torch", "hvdplus.tensorflow", "hvdplus.keras"])
def test_gpu_available_answers_false_for_every_framework(module, capsys):
    # Horovod's horovod.tensorflow and horovod.torch.mpi_ops (served by hvdplus.torch) export it;
    # hvdplus has no GPU build, so the truthful answer is False whatever the machine has.
    adapter = pytest.importorskip(module)
    assert adapter.gpu_available("torch") is False
    assert adapter.gpu_available("tensorflow", verbose=True) is False
    assert "extension tensorflow was NOT built with GPU support" in capsys.readouterr().out


def test_shutdown_then_init_again(uninitialized):
    hvd.init()
    hvd.shutdown()
    with pytest.raises(hvd.NotInitializedError):
        hvd.rank()
    hvd.init()
    assert hvd.rank() == 0


def test_init_with_a_communicator_or_rank_list(uninitialized):
    from mpi4py import MPI

    hvd.init(comm=MPI.COMM_SELF)
    assert hvd.size() == 1
    hvd.shutdown()
    hvd.init(comm=[0])
    assert hvd.size() == 1
    hvd.shutdown()
    with pytest.raises(ValueError, match=r"distinct world ranks in \[0, 1\)"):
        hvd.init(comm=[0, 3])


def test_local_input_errors_raise_directly_in_a_job_of_one(uninitialized):
    hvd.init()
    with pytest.raises(ValueError, match="root_rank 1 is out of range for a job of 1 ranks"):
        hvd.broadcast(np.ones(2), root_rank=1)
    with pytest.raises(TypeError, match="unsupported dtype"):
        hvd.allreduce(np.array(["text"]))
    with pytest.raises(ValueError, match="unknown reduce op"):
        hvd.allreduce(np.ones(2), op="median")


def run_python(command, timeout=60):
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_import_does_not_start_mpi():
    result = run_python(program("report_mpi_loaded_by_import"))
    assert result.stdout.strip() == "False", result.stderr


@pytest.mark.timeout(60)
def test_plain_python_is_rank_0_of_1():
    result = run_python(program("hvdplus_rank_and_size"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0 1"


@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_hvdplusrun_three_ranks_print_their_ranks(mpi_job):
    result = mpi_job(3, program("hvdplus_rank_and_size"), timeout=60)
    assert result.returncode == 0, result.stderr
    lines = sorted(line.split("]")[-1].split(":")[-1].strip() for line in result.stdout.splitlines() if line.strip())
    assert lines == ["0 3", "1 3", "2 3"], result.stdout


def open_mpi_mpirun():
    found = shutil.which("mpirun", path=os.path.join(sys.prefix, "bin")) or shutil.which("mpirun")
    if not found:
        return None
    version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30).stdout
    return found if "Open MPI" in version else None


@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_plain_mpirun_three_ranks():
    mpirun = open_mpi_mpirun()
    if mpirun is None:
        pytest.skip("this check spells Open MPI's flags")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    result = subprocess.run(
        [mpirun, "--oversubscribe", "-np", "3", *program("hvdplus_rank_and_size")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split("\n"))[-3:] == ["0 3", "1 3", "2 3"]


@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_uncaught_exception_on_one_rank_aborts_the_job_quickly(mpi_job):
    # Without hvdplusrun's exit guard, which reports the exception to the launcher instead
    # (tests/test_failure_summary.py): hvdplus' excepthook is what aborts the job here.
    started = time.monotonic()
    result = mpi_job(2, program("one_rank_leaves_early", "--rank", "1", "--raise", "boom on rank one"), timeout=60,
                     launcher_args=["--no-exit-guard"])
    assert result.returncode != 0
    timing.assert_took_under(time.monotonic() - started, 30, quiet=2.1, what="a job aborting on an uncaught exception")
    assert "boom on rank one" in result.stderr + result.stdout
    assert "aborting the job" in result.stderr + result.stdout


@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_init_with_a_rank_list_in_a_real_job(mpi_job):
    result = mpi_job(3, program("init_with_rank_list"), timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "world 0 -> rank 0 of 2 sum 2" in result.stdout
    assert "world 2 -> rank 1 of 2 sum 2" in result.stdout
    assert "world 1 left out" in result.stdout


@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_node_id_variable_groups_ranks_into_nodes(mpi_job):
    # Ranks 0 and 2 pose as one node, 1 and 3 as another: nodes need not be contiguous.
    result = mpi_job(4, program("nodes_by_rank_parity"), timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    for line in ("rank 0 local 0/2 cross 0/2", "rank 1 local 0/2 cross 1/2",
                 "rank 2 local 1/2 cross 0/2", "rank 3 local 1/2 cross 1/2"):
        assert line in result.stdout, result.stdout
