"""How a collective's error leaves a graph (hvdplus/tensorflow/graph_errors.py), on host
functions that fail as a collective does, in one process: a mismatch is Horovod's
tf.errors.FailedPreconditionError in a tf.function and in a tf.compat.v1 Session too, with
hvdplus's message; other errors keep the class TensorFlow gives them; results pass unchanged."""

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")
from hvdplus.common.errors import StalledError, TensorMismatchError  # noqa: E402
from hvdplus.tensorflow.buffers import run_on_host  # noqa: E402

MISMATCH = "Mismatched shapes for 'w' (allreduce): rank 0 had (2,), ranks 1, 2 had (3,)"
DTYPES = [tf.float32, tf.bfloat16, tf.int64, tf.uint8, tf.bool]


def host_op(fails_with, dtypes):
    """An op whose host function raises `fails_with` (or gives ones of `dtypes` when None)."""

    def collective(*arrays):
        if fails_with is not None:
            raise fails_with
        return [np.ones([2, 3], dtype.as_numpy_dtype) for dtype in dtypes]

    return run_on_host(collective, [tf.zeros([2, 3])], dtypes, [[None, 3]] * len(dtypes))


def in_mode(mode, build):
    if mode == "tf.function":
        return tf.function(build)()
    with tf.Graph().as_default():
        fetches = build()
        with tf.compat.v1.Session() as session:
            return session.run(fetches)


MODES = ["tf.function", "session"]


@pytest.mark.parametrize("mode", MODES)
def test_a_mismatch_is_failed_precondition_with_hvdplus_message(mode):
    # An op without outputs (a barrier) runs in a tf.function, which runs every stateful op;
    # a Session runs only what is fetched.
    for dtypes in (DTYPES, [tf.float32]) + (([],) if mode == "tf.function" else ()):
        with pytest.raises(tf.errors.FailedPreconditionError) as caught:
            in_mode(mode, lambda: host_op(TensorMismatchError(MISMATCH), dtypes) or tf.constant(0))
        assert MISMATCH in caught.value.message


@pytest.mark.parametrize("mode", MODES)
def test_other_errors_keep_tensorflows_classes(mode):
    with pytest.raises(tf.errors.InvalidArgumentError, match="root rank 7 is out of range"):
        in_mode(mode, lambda: host_op(ValueError("root rank 7 is out of range"), [tf.float32]))
    with pytest.raises(tf.errors.UnknownError, match="stalled"):
        in_mode(mode, lambda: host_op(StalledError("stalled for 60 s"), [tf.float32]))


@pytest.mark.parametrize("mode", MODES)
def test_results_pass_unchanged(mode):
    results = in_mode(mode, lambda: host_op(None, DTYPES))
    for result, dtype in zip(results, DTYPES):
        np.testing.assert_array_equal(np.asarray(result), np.ones([2, 3], dtype.as_numpy_dtype))
        assert np.asarray(result).dtype == dtype.as_numpy_dtype


def test_static_shapes_are_kept():
    def build():
        (result,) = host_op(None, [tf.float32])
        assert result.shape.as_list() == [None, 3]
        return result

    tf.function(build)()
