"""An elastic PyTorch job that trains with local SGD or DiLoCo, for tests/test_elastic_regimes.py:
the linear model of torch_train.py in float64, each rank stepping on its own batches, and the
state committed only where the ranks' parameters agree (`if optimizer.averaged: state.commit()`).

    torch_regimes.py OUT --regime local_sgd|diloco [--period H] [--kill RANK:STEP:PHASE ...]
                     [--commit-anywhere]

Every step appends (epoch, size, the ids of every rank's batch) to the state's log, which rolls
back with the rest at a re-form, so the log at the end holds the steps the job's weights went
through, in order, and tests/elastic_jobs/replay.py replays them. At the end, rank 0 writes every
rank's weights and the optimizer's own count of its steps. --commit-anywhere commits after every
step, past TorchState.commit()'s refusal, to show that the replay tells such a job apart.
"""

import argparse

import torch

import hvdplus.torch as hvd
import replay
from hvdplus.elastic import State
from kills import Kills

BATCH, LR = 4, 0.05


def initial_model():
    model = torch.nn.Linear(replay.FEATURES, 1, dtype=torch.float64)
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(replay.INITIAL_WEIGHT))
        model.bias.zero_()
    return model


def regime_optimizer(regime, model, period):
    if regime == "local_sgd":
        # Averaged momentum keeps the optimizer's state, too, the same on every rank at each
        # averaging point, so every rank's commit is the same state.
        return hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9), model, period=period,
                            average_optimizer_state=True)
    # Plain inner SGD has no state of its own to differ; the outer step is DiLoCo's default.
    return hvd.DiLoCo(torch.optim.SGD(model.parameters(), lr=LR), model, period=period)


def optimizer_steps(optimizer):
    own = optimizer.state_dict()
    return own["local_sgd_step"] if "local_sgd_step" in own else own["diloco"]["step"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--regime", choices=["local_sgd", "diloco"], required=True)
    parser.add_argument("--period", type=int, default=4)
    parser.add_argument("--kill", action="append", default=[])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--commit-anywhere", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    kills = Kills(args.kill, args.out)
    x, y = replay.dataset()
    data = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y)[:, None],
                                          torch.arange(replay.SAMPLES))
    model = initial_model()
    optimizer = regime_optimizer(args.regime, model, args.period)
    sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=11)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, log=[])
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

    def commit():
        if args.commit_anywhere:
            State.commit(state)  # TorchState.commit() would refuse between averaging points
        elif optimizer.averaged:
            state.commit()

    @hvd.elastic.run
    def train(state):
        while state.epoch < args.epochs:
            loader = torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=state.sampler)
            for batch_idx, (inputs, targets, ids) in enumerate(loader):
                kills.maybe(len(state.log), "step")
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(inputs), targets).backward()
                optimizer.step()
                batches = hvd.allgather_object(ids.tolist(), name="ids")
                state.sampler.record_batch(batch_idx, BATCH)
                state.log.append((state.epoch, hvd.size(), batches))
                commit()
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            commit()

    train(state)
    theta = torch.cat([model.weight.detach().ravel(), model.bias.detach()]).numpy()
    weights = hvd.allgather_object(theta.tolist(), name="weights")
    replay.save(args.out, state.log, resets, model.weight.detach().numpy(), model.bias.detach().numpy(),
                ranks_weights=weights, optimizer_steps=optimizer_steps(optimizer))


if __name__ == "__main__":
    main()
