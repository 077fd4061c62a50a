"""How long a 2-worker job on Ray takes from `ray.kill` of a worker's actor to its next completed
step, by hvdplus's RayExecutor and by Ray Train's own restart.

    python benchmarks/ray_recovery.py [--repeats 3]

Both jobs train the same way: each step all-reduces a 1 MiB gradient, sleeps STEP_SECONDS (the
compute) and keeps the step (a commit that both workers hold), and worker 0 notes the time each
step completes. After KILL_AT_STEP steps the driver kills the actor of worker 1 and times until
worker 0 notes the next completed step.

- `RayExecutor(2, min_workers=1)`: hvdplus's elastic job (`hvdplus.elastic.run`, a commit per
  step). The kill takes the actor's Open MPI daemon with it: a lost host. The launcher restarts
  the job on the worker left, which resumes from the commit on its disk, and grows back onto the
  actor Ray places in the dead one's place.
- Ray Train's `DataParallelTrainer` with its torch backend (gloo) and `FailureConfig(max_failures=1)`:
  each step reports a checkpoint (`ray.train.report`), the way Ray Train keeps progress. The
  kill fails the worker group; Ray Train starts a new one and resumes from `get_checkpoint()`.

A local Ray (`ray.init(num_cpus=3)`, not timed) runs both. Writes
benchmarks/results/ray_recovery_np2.csv (see harness.write_table).
"""

import argparse
import os
import tempfile
import threading
import time

import mpi4py

mpi4py.rc.initialize = False  # this driver only starts jobs; MPI runs in them

import ray  # noqa: E402
from harness import median_rows, write_driver_table  # noqa: E402
from hvdplus.ray import RayExecutor  # noqa: E402

STEP_SECONDS = 0.05
KILL_AT_STEP = 20
STEPS = 60
GRADIENT = 256 * 1024  # float32 values: 1 MiB


def note_step(folder: str, step: int) -> None:
    with open(os.path.join(folder, "steps"), "a") as steps:
        steps.write(f"{step} {time.time()} {os.getpid()}\n")


def hvdplus_training(folder: str) -> None:
    import numpy as np

    import hvdplus as hvd
    hvd.init()
    state = hvd.elastic.ObjectState(weights=np.zeros(GRADIENT, np.float32), step=0)

    @hvd.elastic.run
    def train(state):
        while state.step < STEPS:
            gradient = hvd.allreduce(np.full(GRADIENT, 1.0, np.float32), name="gradient")
            time.sleep(STEP_SECONDS)
            state.weights -= 0.01 * gradient
            state.step += 1
            state.commit()
            if hvd.rank() == 0:
                note_step(folder, state.step)

    train(state)


def ray_train_training(config) -> None:
    import torch
    import torch.distributed as dist

    import ray.train
    checkpoint = ray.train.get_checkpoint()
    weights, step = torch.zeros(GRADIENT), 0
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            saved = torch.load(os.path.join(folder, "state.pt"))
        weights, step = saved["weights"], saved["step"]
    rank = ray.train.get_context().get_world_rank()
    if rank == 1:
        with open(os.path.join(config["folder"], "victim"), "w") as victim:
            victim.write(str(os.getpid()))
    while step < STEPS:
        gradient = torch.ones(GRADIENT)
        dist.all_reduce(gradient)
        time.sleep(STEP_SECONDS)
        weights -= 0.01 * gradient
        step += 1
        with tempfile.TemporaryDirectory() as folder:
            if rank == 0:
                torch.save({"weights": weights, "step": step}, os.path.join(folder, "state.pt"))
            ray.train.report({"step": step}, checkpoint=ray.train.Checkpoint.from_directory(folder)
                             if rank == 0 else None)
        if rank == 0:
            note_step(config["folder"], step)


def wait_for_step(folder: str, step: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while len(read_steps(folder)) < step:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the job did not reach step {step} within {timeout:.0f} s")
        time.sleep(0.01)


def read_steps(folder: str):
    try:
        with open(os.path.join(folder, "steps")) as steps:
            return [(int(step), float(when), int(pid))
                    for step, when, pid in (line.split() for line in steps if line.strip())]
    except FileNotFoundError:
        return []


def recovered_after(folder: str, killed: float) -> float:
    """Seconds from `killed` to the first step that a process started since completed (the step
    in flight at the kill may still complete in worker 0's old process: that is no recovery)."""
    steps = read_steps(folder)
    before = [pid for _, when, pid in steps if when <= killed][-1]
    return min(when for _, when, pid in steps if when > killed and pid != before) - killed


def hvdplus_recovery(folder: str) -> float:
    executor = RayExecutor(2, min_workers=1)
    executor.start()
    try:
        references = executor.run_remote(hvdplus_training, args=(folder,))
        wait_for_step(folder, KILL_AT_STEP)
        killed = time.time()
        ray.kill(executor.workers[1])
        ray.get(references, timeout=300)
    finally:
        executor.shutdown()
    return recovered_after(folder, killed)


def ray_train_recovery(folder: str) -> float:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    trainer = TorchTrainer(ray_train_training, train_loop_config={"folder": folder},
                           torch_config=TorchConfig(backend="gloo"),
                           scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
                           run_config=RunConfig(storage_path=os.path.join(folder, "storage"),
                                                failure_config=FailureConfig(max_failures=1)))
    fitting = threading.Thread(target=trainer.fit, daemon=True)
    fitting.start()
    wait_for_step(folder, KILL_AT_STEP)
    killed = time.time()
    with open(os.path.join(folder, "victim")) as victim:
        os.kill(int(victim.read()), 9)  # what ray.kill does to an actor's process
    fitting.join(timeout=300)
    return recovered_after(folder, killed)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--csv", metavar="PATH", help="default: benchmarks/results/ray_recovery_np2.csv")
    args = parser.parse_args()
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    ways = {"hvdplus RayExecutor(min_workers=1)": hvdplus_recovery,
            "Ray Train TorchTrainer (gloo), FailureConfig(max_failures=1)": ray_train_recovery}
    seconds = {way: [] for way in ways}
    for _ in range(args.repeats):
        for way, recover in ways.items():
            with tempfile.TemporaryDirectory(prefix="hvdplus-ray-recovery-") as folder:
                seconds[way].append(recover(folder))
    ray.shutdown()
    write_driver_table("ray_recovery", median_rows(seconds), args.csv, "python benchmarks/ray_recovery.py")


if __name__ == "__main__":
    main()
