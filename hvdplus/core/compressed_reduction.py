"""Compressors that reduce a tensor themselves, with state per tensor: the seam between the
framework-free compression (int8, top-k, PowerSGD here, in numpy over the core's
collectives) and each framework's optimizer.

A LossyCompression's `stages(array, name, state, factor, process_set)` is a generator: each
`next()` submits the collectives of one stage and returns; the last writes `factor` times
the ranks' (approximate) sum into `array`. An optimizer starts every gradient's first stage
during backward and drives them all, stage by stage, at its step (`finish_all`), so the
stages of many tensors overlap. `state` (an ArrayState, or None for no memory) holds what
lives from step to step: the error feedback ("compression_error": what was not sent, added
to the next step's gradient) and PowerSGD's Q. An adapter keeps it in its optimizer's state
so checkpoints, broadcast_optimizer_state and elastic commits carry it.
"""

import inspect
import zlib

import numpy as np

from ..common.errors import TensorMismatchError
from ..common.reduce_ops import ReduceOp
from .collectives import allgather_object, allreduce
from .communication_stats import count_payload, count_tensor

__all__ = ["LossyCompression", "ArrayState", "ERROR_KEY", "started", "finish_all", "reduce_now",
           "require_same_compression", "compression_label"]

ERROR_KEY = "compression_error"
# Above every code (a CRC-32 plus one), so that K - code stays positive.
_CODES = 2 ** 33


class ArrayState:
    """One tensor's compression state: numpy arrays and counts in a dict (`store`), which an
    adapter may back with its own tensors (override `array`)."""

    def __init__(self, store=None):
        self.store = {} if store is None else store

    def array(self, key, shape, dtype, initial=None) -> np.ndarray:
        """The array kept under `key`, made from `initial()` (else zeros) when absent or of
        another shape."""
        value = self.store.get(key)
        if value is None or tuple(value.shape) != tuple(shape):
            value = np.zeros(shape, dtype) if initial is None else np.asarray(initial(), dtype=dtype)
            self.store[key] = value
        return value

    def count(self, key) -> int:
        return int(self.store.get(key, 0))

    def set_count(self, key, value: int) -> None:
        self.store[key] = int(value)


class LossyCompression:
    """Base of the compressors with state: subclasses give `label`, `__repr__` and `_stages`."""

    label = "lossy"

    def compress(self, tensor):
        raise ValueError(f"{self!r} reduces tensors itself, with collectives of its own: use it with "
                         "DistributedOptimizer(compression=...) or allreduce(compression=...)")

    decompress = compress

    def stages(self, array, name, state, factor, process_set):
        """Reduce `array` (a C-contiguous float numpy array, written in place) over
        `process_set`, as `factor` times the sum; a generator, one `next()` per stage."""
        if not np.issubdtype(array.dtype, np.floating):
            raise ValueError(f"{self!r}: '{name}' is {array.dtype}; it compresses floating-point tensors only")
        count_tensor(self.label, array.nbytes)
        stages = self._stages(array, name, state, factor, process_set)
        try:
            yield from stages
        except TensorMismatchError as error:
            # Ranks that disagree on compression submit different collectives under one name.
            raise TensorMismatchError(f"{error}\n  this rank reduces '{name}' with {self!r}; every rank must use "
                                      "the same compression") from None

    def _stages(self, array, name, state, factor, process_set):
        raise NotImplementedError

    def _compensated(self, flat, state):
        """The gradient plus what earlier steps did not send (error feedback)."""
        if state is None:
            return flat.copy()
        return flat + state.array(ERROR_KEY, flat.shape, flat.dtype)

    @staticmethod
    def _keep_error(state, compensated, sent):
        """Remember what this step did not send, for the next one."""
        if state is not None:
            state.array(ERROR_KEY, compensated.shape, compensated.dtype)[...] = compensated - sent

    def _submitted(self, kind, payload):
        count_payload(self.label, kind, payload.nbytes)
        return payload


def sub_name(name, part):
    """The name of a reduction's later collective: None stays None (named by call order)."""
    return None if name is None else f"{name}.{part}"


def started(stages):
    """`stages` with its first stage submitted (during backward, so it overlaps the rest)."""
    next(stages, None)
    return stages


def finish_all(pending) -> None:
    """Run every pending reduction to its end: callables are called; generators are advanced
    together, one stage of each per round, so each stage's collectives are all submitted
    before any of them is waited for."""
    live = []
    for item in pending:
        if inspect.isgenerator(item):
            live.append(item)
        else:
            item()
    sentinel = object()
    while live:
        live = [item for item in live if next(item, sentinel) is not sentinel]


def reduce_now(compression, array, name, factor, process_set, state=None):
    """Reduce `array` in place with `compression` at once (no error feedback without `state`)."""
    finish_all([compression.stages(array, name, state, factor, process_set)])
    return array


def compression_label(compression) -> str:
    """"none", "fp16", "bf16", "int8", ... for the counts (communication_stats)."""
    label = getattr(compression, "label", None)
    if isinstance(label, str):
        return label
    name = getattr(compression, "__name__", type(compression).__name__).lower()
    return name[:-len("compressor")] if name.endswith("compressor") else name


def require_same_compression(compression, what, process_set=None) -> None:
    """Raise ValueError on every rank unless every rank of `process_set` compresses alike.

    One MAX all-reduce of (code, K - code) gives the largest and the smallest code; an
    all-reduce, unlike an allgather, runs beside ranks that have joined (hvd.Join), whose zeros
    change neither. Only where the codes differ are the descriptions gathered, to name them."""
    mine = repr(compression) if isinstance(compression, LossyCompression) else compression_label(compression)
    code = zlib.crc32(mine.encode()) + 1
    largest, complement = allreduce(np.array([code, _CODES - code], dtype=np.int64), op=ReduceOp.MAX,
                                    name=f"{what}.compression", process_set=process_set)
    if largest == _CODES - complement:
        return
    every = allgather_object(mine, name=f"{what}.compressions", process_set=process_set)
    ranks = {}
    for rank, description in enumerate(every):
        ranks.setdefault(description, []).append(rank)
    listed = "; ".join(f"{description} on ranks {members}" for description, members in ranks.items())
    raise ValueError(f"{what}: the ranks compress differently ({listed}); pass the same compression= on every rank")
