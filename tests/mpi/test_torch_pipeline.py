"""Pipeline parallelism (hvdplus.torch.pipeline): a model split into stages over the ranks,
with GPipe and 1F1B schedules, alone and with data-parallel replicas of each stage, trains
to the same weights and losses as one process training the whole model on the same
global batches."""

import copy

import pytest

torch = pytest.importorskip("torch")

import hvdplus.torch as hvd  # noqa: E402
from hvdplus.torch import stage_costs  # noqa: E402
from hvdplus.torch.pipeline import Pipeline, schedule, split_sequential  # noqa: E402

STEPS, BATCH, CHUNKS, LR = 3, 8, 4, 0.1


def whole_model():
    torch.manual_seed(5)
    # Seven layers: split evenly into 2, 3 or 4 stages, each stage holds a Linear.
    return torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8),
        torch.nn.Tanh(), torch.nn.Linear(8, 3),
    ).double()


def batches():
    generator = torch.Generator().manual_seed(9)
    return [(torch.randn(BATCH, 4, dtype=torch.float64, generator=generator),
             torch.randn(BATCH, 3, dtype=torch.float64, generator=generator)) for _ in range(STEPS)]


def reference(model):
    """The whole model trained in one process on every global batch: losses, final model."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for x, y in batches():
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, model


def train_pipelined(kind, stages, pipeline_set, replica_set, replicas, replica):
    pipe = Pipeline(stages, process_set=pipeline_set, chunks=CHUNKS, schedule=kind)
    optimizer = torch.optim.SGD(pipe.module.parameters(), lr=LR)
    if replicas > 1:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=pipe.module.named_parameters(),
                                             process_set=replica_set, backward_passes_per_step=CHUNKS)
    share = BATCH // replicas
    losses = []
    for x, y in batches():
        optimizer.zero_grad()
        rows = slice(replica * share, (replica + 1) * share)
        loss = pipe.train_step(x[rows] if pipe.is_first else None, y[rows] if pipe.is_last else None)
        optimizer.step()
        losses.append(None if loss is None else loss.item())
    return pipe, losses


def check_against_reference(pipe, losses, stage_count, replicas, replica_set, counts=None):
    expected_losses, trained = reference(whole_model())
    expected_stage = split_sequential(trained, stage_count, balance=counts)[pipe.stage]
    for (name, got), (_, want) in zip(pipe.module.named_parameters(), expected_stage.named_parameters()):
        torch.testing.assert_close(got, want, msg=lambda m: f"stage {pipe.stage} {name}: {m}")
    if pipe.is_last:
        # Each replica's loss is its half's; their mean is the global batch's.
        mean = losses
        if replicas > 1:
            mean = [hvd.allreduce(torch.tensor(loss, dtype=torch.float64), process_set=replica_set).item()
                    for loss in losses]
        assert mean == pytest.approx(expected_losses, rel=1e-9)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_pipeline_over_every_rank_equals_one_process(kind, rank, size):
    if size == 1:
        pytest.skip("a pipeline needs 2 ranks")
    stages = split_sequential(copy.deepcopy(whole_model()), size)
    pipe, losses = train_pipelined(kind, stages, hvd.global_process_set, None, 1, 0)
    check_against_reference(pipe, losses, size, 1, None)


def test_a_split_by_time_is_the_first_ranks_on_every_rank_and_trains_like_one_process(rank, size):
    # The first rank measures and every rank takes its costs (here: costs that would differ by rank).
    assert stage_costs.measured_on_first_rank(lambda: [float(rank), 1.0, 2.0]) == [0.0, 1.0, 2.0]
    if size == 1:
        pytest.skip("a pipeline needs 2 ranks")
    sample = torch.randn(BATCH // CHUNKS, 4, dtype=torch.float64)
    stages = split_sequential(copy.deepcopy(whole_model()), size, balance="time", sample=sample)
    counts = [len(stage) for stage in stages]
    assert hvd.allgather_object(counts) == [counts] * size
    pipe, losses = train_pipelined("1f1b", stages, hvd.global_process_set, None, 1, 0)
    check_against_reference(pipe, losses, size, 1, None, counts)


def test_a_measurement_that_fails_on_the_first_rank_raises_on_every_rank(rank, size):
    def measure():
        if rank == 0:
            raise RuntimeError("out of memory while timing layer 3")
        return [1.0]  # never taken: only the first rank measures

    with pytest.raises(RuntimeError, match="out of memory while timing layer 3"):
        stage_costs.measured_on_first_rank(measure)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_two_stages_times_two_replicas_equal_one_process(kind, rank, size):
    if size != 4:
        pytest.skip("2 stages x 2 replicas need 4 ranks")
    stage, replica = rank % 2, rank // 2           # rank = 2 * replica + stage
    pipelines = [hvd.add_process_set([0, 1]), hvd.add_process_set([2, 3])]
    replica_sets = [hvd.add_process_set([0, 2]), hvd.add_process_set([1, 3])]
    try:
        stages = split_sequential(copy.deepcopy(whole_model()), 2)
        pipe, losses = train_pipelined(kind, stages, pipelines[replica], replica_sets[stage], 2, replica)
        check_against_reference(pipe, losses, 2, 2, replica_sets[stage])
    finally:
        for process_set in pipelines + replica_sets:
            hvd.remove_process_set(process_set)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_each_schedule_runs_every_pass_once_forward_before_backward(kind, stages):
    chunks = 5
    for stage in range(stages):
        steps = schedule(kind, stage, stages, chunks)
        assert sorted(steps) == sorted([(direction, m) for direction in ("forward", "backward") for m in range(chunks)])
        for m in range(chunks):
            assert steps.index(("forward", m)) < steps.index(("backward", m))
        held = peak = 0
        for step, _ in steps:
            held += 1 if step == "forward" else -1
            peak = max(peak, held)
        assert peak == (chunks if kind == "gpipe" else min(stages - stage, chunks))
