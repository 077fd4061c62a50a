"""Jobs started from a real Jupyter kernel (ipykernel, driven by nbclient): examples/notebook.ipynb
trains a model of its cells on 2 ranks to the weights of one process, through `hvdplus.run` and
through a `RayExecutor` on a local Ray; the ranks' prints and rank 0's progress bar show in the
cell; a raising rank gives `RanksRaisedError` in the cell; interrupting the kernel mid-job ends
every rank, and the next cell's job runs."""

import os
import re
import signal
import threading
import time

import nbformat
import pytest
from nbclient import NotebookClient

from testkit.mpi_jobs import REPO

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(400)]

EXAMPLE = os.path.join(REPO, "examples", "notebook.ipynb")
RUN_LINE = "weights = hvdplus.run(train, args=(features, targets), np=2)"

# What each way of starting a job needs before its first job, and how it runs `fn` with `args`.
WAYS = {
    "hvdplus.run": ("", "hvdplus.run({fn}, args={args}, np=2)"),
    "RayExecutor": ("import ray\n"
                    "from hvdplus.ray import RayExecutor\n"
                    "ray.init(num_cpus=2, include_dashboard=False)\n"
                    "executor = RayExecutor(num_workers=2)\n"
                    "executor.start()",
                    "executor.run({fn}, args={args})"),
}


def after_the_example(folder, start):
    """Cells for the kernel that ran the example: a rank that raises, a job interrupted while its
    ranks sleep (each first writes its process id into `folder`), then a job that must run."""
    return [
        ("define", "def raise_on_rank_1():\n"
             "    import hvdplus as hvd\n"
             "    hvd.init()\n"
             "    if hvd.rank() == 1:\n"
             "        raise ValueError('no data for rank 1')\n"
             "    return hvd.rank()\n\n"
             "def sleep(folder):\n"
             "    import os, time\n"
             "    import hvdplus as hvd\n"
             "    hvd.init()\n"
             "    open(os.path.join(folder, str(os.getpid())), 'w').close()\n"
             "    time.sleep(300)\n\n"
             "def rank_and_size():\n"
             "    import hvdplus as hvd\n"
             "    hvd.init()\n"
             "    return hvd.rank(), hvd.size()"),
        ("raises", start.format(fn="raise_on_rank_1", args="()")),
        ("interrupted", start.format(fn="sleep", args=(repr(str(folder)) + ",").join("()"))),
        ("next", f"print('next job:', {start.format(fn='rank_and_size', args='()')})"),
    ]


def rendered(text):
    """Stream text as a notebook shows it: within a line, a carriage return starts it over."""
    return "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n"))


def stream_text(cell):
    return "".join(output.get("text", "") for output in cell.outputs if output.output_type == "stream")


def interrupt_once_ranks_sleep(client, folder, count, done):
    """Interrupt the kernel as Jupyter does (SIGINT to its process group) once `count` ranks sleep."""
    deadline = time.monotonic() + 300
    while len(os.listdir(folder)) < count and time.monotonic() < deadline and not done.is_set():
        time.sleep(0.2)
    if not done.is_set():
        time.sleep(1)
        os.killpg(client.km.provisioner.pgid, signal.SIGINT)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie has ended: it waits only for its parent
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("way", sorted(WAYS))
def test_a_notebook_trains_prints_fails_and_is_interrupted(way, tmp_path):
    setup, start = WAYS[way]
    sleeping = tmp_path / "sleeping"
    sleeping.mkdir()
    notebook = nbformat.read(EXAMPLE, as_version=4)
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    run_cell = next(cell for cell in cells if cell.source == RUN_LINE)
    run_cell.source = "weights = " + start.format(fn="train", args="(features, targets)")
    if setup:
        notebook.cells.insert(notebook.cells.index(run_cell), nbformat.v4.new_code_cell(setup))
    for cell_id, source in after_the_example(sleeping, start):
        cell = nbformat.v4.new_code_cell(source)
        cell.id = cell_id
        if cell_id in ("raises", "interrupted"):
            cell.metadata["tags"] = ["raises-exception"]  # the error is recorded, and the next cell runs
        notebook.cells.append(cell)

    client = NotebookClient(notebook, timeout=240, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    done = threading.Event()
    interrupter = threading.Thread(target=interrupt_once_ranks_sleep, args=(client, sleeping, 2, done), daemon=True)
    interrupter.start()
    try:
        client.execute()
    finally:
        done.set()

    by_id = {cell.get("id"): cell for cell in notebook.cells}
    # The example's cells: the ranks' prints, rank 0's bar drawn to its end, weights of one process.
    printed = rendered(stream_text(run_cell))
    for rank in range(2):
        assert re.search(rf"^\S*\s*rank {rank} of 2 trains on 256 samples$", printed, re.M), printed
    assert re.search(r"training: 100%\|█+\| 30/30", printed), printed
    compared = next(cell for cell in cells if "assert_allclose" in cell.source)
    assert "2 ranks reach the weights of one process" in stream_text(compared), compared.outputs

    raised = [output for output in by_id["raises"].outputs if output.output_type == "error"]
    assert [output.ename for output in raised] == ["RanksRaisedError"], by_id["raises"].outputs
    assert "rank 1" in raised[0].evalue and "ValueError: no data for rank 1" in raised[0].evalue, raised[0].evalue
    assert "line 5, in raise_on_rank_1" in raised[0].evalue, raised[0].evalue  # the traceback, from the cell on

    interrupted = [output.ename for output in by_id["interrupted"].outputs if output.output_type == "error"]
    assert interrupted == ["KeyboardInterrupt"], by_id["interrupted"].outputs
    pids = [int(name) for name in os.listdir(sleeping)]
    assert len(pids) == 2
    assert not [pid for pid in pids if alive(pid)], "ranks outlived the interrupt"
    assert "next job: [(0, 2), (1, 2)]" in stream_text(by_id["next"]), by_id["next"].outputs
