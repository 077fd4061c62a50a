"""Keras tests run inside every rank, once per backend (KERAS_BACKEND is set by the job)."""

import pytest

keras = pytest.importorskip("keras")
import hvdplus.keras as hvd  # noqa: E402

hvd.init()


@pytest.fixture
def rank():
    return hvd.rank()


@pytest.fixture
def size():
    return hvd.size()
