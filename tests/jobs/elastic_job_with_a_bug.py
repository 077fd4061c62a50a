"""An elastic training function in which rank 1 raises KeyError: a bug, not a lost rank.
tests/test_elastic.py checks that hvdplusrun's elastic mode ends the job with the error
instead of restarting it."""

import hvdplus as hvd

hvd.init()
state = hvd.elastic.ObjectState(step=0)


@hvd.elastic.run
def train(state):
    if hvd.rank() == 1:
        raise KeyError("a bug in the training script")
    hvd.barrier()


train(state)
