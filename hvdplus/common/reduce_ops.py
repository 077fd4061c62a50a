"""Reduction operators, numbered as Horovod numbers them so `op=hvd.Sum` reads the same."""

import enum

__all__ = ["ReduceOp", "Average", "Sum", "Adasum", "Min", "Max", "Product", "as_reduce_op", "reduce_op_from",
           "ELEMENTWISE_OPS"]


class ReduceOp(enum.IntEnum):
    AVERAGE = 0
    SUM = 1
    ADASUM = 2  # not elementwise: see hvdplus.comm.adasum
    MIN = 3
    MAX = 4
    PRODUCT = 5

    @property
    def label(self) -> str:
        return self.name.capitalize()


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT


# The ops every all-reduce algorithm applies element by element.
ELEMENTWISE_OPS = tuple(op for op in ReduceOp if op != ReduceOp.ADASUM)


def as_reduce_op(op) -> ReduceOp:
    """Accept a ReduceOp, its Horovod number, or its name ("sum", "Average")."""
    if type(op) is ReduceOp:  # the common case, without the enum's lookup (every submission asks)
        return op
    if isinstance(op, str):
        try:
            return ReduceOp[op.upper()]
        except KeyError:
            pass
    else:
        try:
            return ReduceOp(op)
        except ValueError:
            pass
    names = ", ".join(member.label for member in ReduceOp)
    raise ValueError(f"unknown reduce op {op!r}; expected one of {names}")


def reduce_op_from(average, op):
    """Horovod's deprecated `average=` flag and `op=` as one op (Average by default). `op`
    itself is checked where it is agreed, so that a bad one fails on every rank alike."""
    if average is not None:
        if op is not None:
            raise ValueError("pass op= or the deprecated average=, not both")
        return Average if average else Sum
    return Average if op is None else op
