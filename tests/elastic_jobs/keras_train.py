"""An elastic Keras job for tests/test_elastic_keras.py: replay.py's linear problem, trained
with `model.fit` under hvdplus.keras.elastic.run and its state callbacks, on the Keras
backend that KERAS_BACKEND names (torch unless set).

    keras_train.py OUT [--kill RANK:STEP ...] [--epochs E] [--predivide F]

Every rank deals the samples of an epoch that are not yet committed the same way: global
step j takes the next size * BATCH of them, rank r every size-th of those from the r-th.
Each committed step appends (epoch, size, the ids of every rank's batch) to the state's
log, which replay.py checks and replays with numpy. A rank named by --kill dies (SIGKILL)
as it begins committed step STEP, once per job (a marker file next to OUT remembers it).
`--predivide` gives the optimizer a gradient_predivide_factor, whose scale depends on the
job's size.
"""

import argparse
import json
import os
import signal

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import replay  # noqa: E402

import hvdplus.keras as hvd  # noqa: E402

BATCH, SEED = 4, 11


def build_model():
    model = keras.Sequential([keras.Input((replay.FEATURES,)), keras.layers.Dense(
        1, kernel_initializer=keras.initializers.Constant(np.linspace(-0.2, 0.2, replay.FEATURES)[:, None]),
        bias_initializer="zeros")])
    return model


def epoch_steps(state):
    """The global steps left in `state.epoch`, each the ids of every rank's batch."""
    order = np.random.default_rng(SEED + state.epoch).permutation(replay.SAMPLES)
    done = {i for epoch, _, batches in state.log if epoch == state.epoch for batch in batches for i in batch}
    left = [int(i) for i in order if int(i) not in done]
    size, chunk = hvd.size(), hvd.size() * BATCH
    return [[left[start:start + chunk][rank::size] for rank in range(size)] for start in range(0, len(left), chunk)]


class Kill(keras.callbacks.Callback):
    """SIGKILLs this rank as it begins the committed step that a --kill plan names."""

    def __init__(self, state, plans, out):
        super().__init__()
        self.state = state
        self.plans = [tuple(int(part) for part in plan.split(":")) for plan in plans]
        self.out = out

    def on_train_batch_begin(self, batch, logs=None):
        step = len(self.state.log)
        for rank, at in self.plans:
            marker = f"{self.out}.killed-{rank}-{at}"
            if rank == hvd.rank() and at == step and not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)


class LogStep(keras.callbacks.Callback):
    """Appends each finished step of `steps` to the state's log, before it is committed."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.steps = []

    def on_train_batch_end(self, batch, logs=None):
        self.state.log.append((self.state.epoch, hvd.size(), self.steps[batch]))


def fit_epoch(model, state, log_step, callbacks):
    """Train what is left of `state.epoch` (as many batches as the epoch's log lacks)."""
    steps = epoch_steps(state)
    assert state.batch == sum(1 for epoch, *_ in state.log if epoch == state.epoch), (state.batch, state.epoch)
    log_step.steps = steps
    if not steps:  # every batch was committed, the end of the epoch was not
        state.epoch, state.batch = state.epoch + 1, 0
        state.commit()
        return
    x, y = replay.dataset()
    mine = [i for step in steps for i in step[hvd.rank()]]
    model.fit(x[mine].astype("float32"), y[mine, None].astype("float32"), batch_size=BATCH, shuffle=False,
              initial_epoch=state.epoch, epochs=state.epoch + 1, callbacks=callbacks, verbose=0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--kill", action="append", default=[])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--predivide", type=float, default=1.0)
    args = parser.parse_args()
    hvd.init()
    model = build_model()
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9),
                                         gradient_predivide_factor=args.predivide)
    model.compile(optimizer=optimizer, loss="mse")
    state = hvd.elastic.KerasState(model, batch=0, epoch=0, log=[])
    log_step = LogStep(state)
    callbacks = [Kill(state, args.kill, args.out), log_step, hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.UpdateBatchStateCallback(state), hvd.elastic.CommitStateCallback(state)]

    @hvd.elastic.run
    def train(state):
        while state.epoch < args.epochs:
            fit_epoch(model, state, log_step, callbacks)

    train(state)
    if hvd.rank() == 0:
        weights = model.get_weights()
        with open(args.out, "w") as file:
            json.dump({"log": state.log, "size": hvd.size(), "weight": weights[0].ravel().tolist(),
                       "bias": weights[1].tolist(), "epoch": state.epoch, "batch": state.batch}, file)


if __name__ == "__main__":
    main()
