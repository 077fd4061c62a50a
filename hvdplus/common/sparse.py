"""Sparse gradients (torch's sparse COO tensors, TensorFlow's IndexedSlices): the rule every
adapter follows, as Horovod's do. The adapters hold the tensors; this module decides.

A sparse gradient is gathered, not all-reduced: every rank's values and indices are
allgathered, and rows that repeat add up where the result is coalesced or applied. A gather
is a sum, so it stands for Sum, and for Average once the gathered values are divided by the
number of ranks. A wrapped optimizer scales them by its reduction's factor instead
(scaling.Reduction.factor), which carries gradient_predivide_factor too. With
`sparse_as_dense`, a sparse gradient is made dense and all-reduced with the rest.
"""

from .reduce_ops import Average, Sum

__all__ = ["GATHERED_OPS", "gathered", "densified", "divides_gathered"]

# The ops a gather of every rank's rows can stand for.
GATHERED_OPS = (Average, Sum)


def gathered(is_sparse: bool, sparse_as_dense: bool) -> bool:
    """Whether a gradient travels by allgather: a sparse one, unless `sparse_as_dense` asks
    for it dense (a sparse gradient that is not gathered is made dense)."""
    return is_sparse and not sparse_as_dense


def densified(gradients: list, sparse_as_dense: bool, sparse_type: type, to_dense) -> list:
    """`gradients` with each sparse one (an instance of `sparse_type`) that is not gathered
    made dense by `to_dense`; `gradients` itself, uncopied, when every sparse one is
    gathered, so that the common case builds no list."""
    if not sparse_as_dense:  # every sparse gradient is gathered
        return gradients
    return [to_dense(gradient) if isinstance(gradient, sparse_type) else gradient for gradient in gradients]


def divides_gathered(op) -> bool:
    """Whether gathered values are divided by the number of ranks to stand for `op`: for
    Average; not for Sum, whose gather is the sum already (and whose values keep their
    dtype, where a division would make integers floating). The adapter asks the size only
    then."""
    return op == Average
