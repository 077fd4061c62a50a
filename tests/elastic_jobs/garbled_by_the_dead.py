"""An elastic job whose rank 2 dies just after a collective, having sent the others an object
that does not load there: what Open MPI's ULFM can hand a rank whose peer died during a
collective (zeros where the peer's data belonged). The survivors must re-form without it
rather than end the job; they write the sizes they trained at to the file given."""

import json
import os
import pickle
import signal
import sys
import time

import hvdplus as hvd


def _load(sender):
    if hvd.rank() != sender:
        raise pickle.UnpicklingError("invalid load key, '\\x00'.")
    return sender


class LoadsOnlyOnItsSender:
    def __reduce__(self):
        return _load, (hvd.rank(),)


def main():
    out = sys.argv[1]
    hvd.init()
    state = hvd.elastic.ObjectState(sizes=[])

    @hvd.elastic.run
    def train(state):
        while len(state.sizes) < 2:
            if hvd.size() == 3:
                hvd.allgather_object(LoadsOnlyOnItsSender() if hvd.rank() == 2 else hvd.rank(), name="garbled")
                if hvd.rank() == 2:
                    time.sleep(0.5)  # after the others failed to load its object
                    os.kill(os.getpid(), signal.SIGKILL)
            state.sizes = state.sizes + [hvd.size()]
            state.commit()

    train(state)
    if hvd.rank() == 0:
        with open(out, "w") as file:
            json.dump(state.sizes, file)


if __name__ == "__main__":
    main()
