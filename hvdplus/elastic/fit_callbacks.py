"""What the elastic callbacks of Keras' `model.fit` do with a state, with no Keras: commit
it, and keep its `batch` and `epoch` counts.

Keras 3 (`hvdplus.keras.elastic`) and tf_keras, the Keras 2 that TensorFlow serves as
`tf.keras` under `TF_USE_LEGACY_KERAS=1` (`hvdplus.tensorflow.keras2.elastic`), each put
these classes before their own `Callback` class, which calls the hooks.
"""

__all__ = ["CommitState", "UpdateBatchState", "UpdateEpochState"]


class CommitState:
    """Commits every `batches_per_commit` batches and at each epoch's end. The count restarts
    with each `fit` and each epoch, so ranks that joined at a re-form commit with the others."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        if batches_per_commit < 1:
            raise ValueError(f"batches_per_commit must be at least 1, got {batches_per_commit}")
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        self.batches_remaining = self.batches_per_commit

    def on_train_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self._commit()

    def on_epoch_end(self, epoch, logs=None):
        self._commit()

    def _commit(self):
        self.state.commit()
        self.batches_remaining = self.batches_per_commit


class UpdateBatchState:
    """`state.batch`: the batches of the epoch done, counted on from its value when the epoch
    began (a `fit` that resumes an epoch counts from 0 again); 0 at the epoch's end."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.first_batch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.first_batch = self.state.batch

    def on_train_batch_end(self, batch, logs=None):
        # `batch` is the last of the steps run at once (steps_per_execution), counted from 0.
        self.state.batch = self.first_batch + batch + 1

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochState:
    """`state.epoch` one up at each epoch's end: the next epoch to run."""

    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch += 1
