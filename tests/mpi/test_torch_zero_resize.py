"""A ZeroRedundancyOptimizer checkpoint across jobs of different sizes: tests/test_zero.py runs
the saving tests in a job of 4 ranks and the loading ones in jobs of 2 and of 3, sharing the
folder HVDPLUS_ZERO_CHECKPOINT_DIR. After loading a consolidated dict, every shard, or the
elastic commit (read as a restart reads it), training goes on equal, at rtol 1e-6, to one
process of plain torch that never stopped."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import hvdplus.torch as hvd  # noqa: E402
from testkit.zero_training import (  # noqa: E402
    CHECKPOINT_DIR, LR, RTOL, groups_of, make_model, train, train_plainly, zero_optimizer)

pytestmark = pytest.mark.timeout(120)


def _checkpoint(name):
    assert CHECKPOINT_DIR, "tests/test_zero.py runs this file with HVDPLUS_ZERO_CHECKPOINT_DIR, a folder two jobs share"
    return os.path.join(CHECKPOINT_DIR, name)


SAVED_AT = 10
RESUMED_TO = 25


def test_save_a_consolidated_checkpoint_and_an_elastic_commit():
    model = make_model()
    optimizer = zero_optimizer(model, "adam", 2)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer)
    train(model, optimizer, SAVED_AT)
    state.commit()
    full = optimizer.consolidate_state_dict(to=0)
    shard = optimizer.state_dict()
    torch.save(shard, _checkpoint(f"shard.{hvd.rank()}.pt"))
    if hvd.rank() == 0:
        torch.save({"model": model.state_dict(), "optimizer": full, "size": hvd.size()}, _checkpoint("full.pt"))
        torch.save(state._handlers["optimizer"].snapshot(), _checkpoint("commit.pt"))


def _resumed_model():
    saved = torch.load(_checkpoint("full.pt"), weights_only=False)
    assert saved["size"] != hvd.size()  # saved by a job of another size
    model = make_model()
    model.load_state_dict(saved["model"])
    return model, saved


def _never_stopped():
    plain = make_model()
    return train_plainly(plain, torch.optim.Adam(groups_of(plain), lr=LR), RESUMED_TO)


@pytest.mark.parametrize("stage", [1, 2])
def test_load_a_checkpoint_of_another_size_and_go_on_as_if_never_stopped(stage):
    model, saved = _resumed_model()
    optimizer = zero_optimizer(model, "adam", stage)
    optimizer.load_state_dict(saved["optimizer"])
    np.testing.assert_allclose(train(model, optimizer, RESUMED_TO, start=SAVED_AT), _never_stopped(),
                               rtol=RTOL, atol=1e-12)


def test_load_every_shard_of_another_size_and_go_on_as_if_never_stopped():
    model, saved = _resumed_model()
    shards = [torch.load(_checkpoint(f"shard.{rank}.pt"), weights_only=False) for rank in range(saved["size"])]
    optimizer = zero_optimizer(model, "adam", 2)
    optimizer.load_state_dict(shards)
    np.testing.assert_allclose(train(model, optimizer, RESUMED_TO, start=SAVED_AT), _never_stopped(),
                               rtol=RTOL, atol=1e-12)


def test_an_elastic_commit_of_another_size_restores_and_goes_on_as_if_never_stopped():
    model, _ = _resumed_model()
    optimizer = zero_optimizer(model, "adam", 2)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer)
    # As a restart at another size does: the commit read from disk, then synced from rank 0.
    state._handlers["optimizer"].load(optimizer, torch.load(_checkpoint("commit.pt"), weights_only=False))
    state._handlers["optimizer"].sync(optimizer, "zero.test.sync", 0)
    np.testing.assert_allclose(train(model, optimizer, RESUMED_TO, start=SAVED_AT), _never_stopped(),
                               rtol=RTOL, atol=1e-12)
