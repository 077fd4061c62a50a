"""The autotuner (hvdplus.engine.autotune) in one process, on a made-up job whose speed
depends on the setting: it must find that job's best setting, and log what it tried; and in
a real job across (posed) nodes, where it moves every rank's algorithm while all-reduces run."""

import pytest

from hvdplus.engine.autotune import CYCLE_MS, FUSION_MIB, MIB, Autotuner, Setting

from testkit.programs import program


def made_up_speed(setting):
    """Bytes per second of a job that runs best at 16 MiB, 2.5 ms and the ring."""
    speed = 100.0 - abs(FUSION_MIB.index(setting.fusion_bytes // MIB) - 2) * 10
    speed -= abs(CYCLE_MS.index(setting.cycle_ms) - 2) * 5
    return speed * (1.2 if setting.algorithm == "ring" else 1.0) * 1e6


def drive(tuner, cycles=2000):
    """Feed the tuner cycles of 1 MB each, as fast as the current setting runs."""
    now = [0.0]
    tuner._clock = lambda: now[0]
    for _ in range(cycles):
        now[0] += 1e6 / made_up_speed(tuner.current)
        tuner.record(1_000_000)
        if tuner.done:
            return
    raise AssertionError("the tuner never finished")


def test_the_tuner_finds_the_best_setting_and_logs_every_sample(tmp_path, capsys):
    log = tmp_path / "autotune.csv"
    tuner = Autotuner(Setting(64 * MIB, 1.0, "hierarchical"), ("hierarchical", "ring", "mpi"),
                      warmup_samples=2, steps_per_sample=5, log_path=str(log))
    drive(tuner)
    assert tuner.best == Setting(16 * MIB, 2.5, "ring")
    lines = log.read_text().splitlines()
    assert lines[0].startswith("sample,fusion_threshold_mib")
    assert sum(line.endswith(",warmup") for line in lines) == 2
    assert len([line for line in lines if line.endswith(",fusion_bytes")]) == 2 * len(FUSION_MIB)
    assert lines[-1].startswith("chosen,16,2.5,ring,")
    chose = "hvdplus autotune: chose fusion threshold 16 MiB, cycle time 2.5 ms, algorithm ring"
    assert chose in capsys.readouterr().err


def test_on_one_node_the_algorithm_is_left_alone():
    tuner = Autotuner(Setting(64 * MIB, 1.0), (), warmup_samples=1, steps_per_sample=3)
    drive(tuner)
    assert tuner.best == Setting(16 * MIB, 2.5, None)


@pytest.mark.mpi
@pytest.mark.parametrize("nranks", [2, 3])
def test_a_tuned_job_across_nodes_stays_exact_while_every_rank_changes_algorithm(mpi_job, nranks):
    env = {"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "1",
           "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "3", "HVDPLUS_RANKS_PER_NODE": "1"}
    result = mpi_job(nranks, program("autotuned_allreduces"), env=env, timeout=180)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    chosen = [line.split()[-1] for line in result.stdout.splitlines() if "tuned " in line]
    assert len(chosen) == nranks and len(set(chosen)) == 1, result.stdout  # every rank ends on one algorithm
    assert "hvdplus autotune: chose" in result.stderr
