"""The names TensorFlow's collectives take, which ranks match them by.

Every rank traces the same code, so an unnamed collective in a graph is named when it is
traced, after its op's place in the graph (`hvdplus_allreduce_2`). A retrace gives the same
names, however often each rank retraces (a last, shorter batch on one rank only). Eagerly,
unnamed collectives are numbered by call order, as the core numbers them (`allreduce.7`),
per process set: a set's collectives leave the job's numbering alone.
"""

import tensorflow as tf

from ..core import process_sets, runtime
from ..core.process_sets import ProcessSet, includes_this_rank, is_job, name_in
from .errors import InvalidArgumentError

__all__ = ["collective_name", "require_member", "what"]


def require_member(process_set, what: str) -> None:
    """The core's check that this rank may call a collective on `process_set`, raising
    Horovod's classes: tf.errors.InvalidArgumentError (hvdplus.tensorflow's, a ValueError
    too) for a set hvdplus holds that does not include this rank, the core's ValueError for
    a set it does not hold (never added, removed, or a forged id)."""
    try:
        process_sets.require_member(process_set, what)
    except ValueError as error:
        if _held_without_this_rank(process_set):
            raise InvalidArgumentError(None, None, str(error)) from None
        raise


def _held_without_this_rank(process_set) -> bool:
    return (runtime.is_initialized() and isinstance(process_set, ProcessSet)
            and process_set.process_set_id is not None
            and includes_this_rank(process_set.process_set_id, "process set") is False)


def collective_name(kind: str, name=None, process_set=None) -> str:
    """`name`; else eagerly the core's next name for `kind` (`allreduce.7`) in `process_set`
    (None: the job), in a graph a name unique in it (`hvdplus_allreduce_2`, or for process
    set 3 `hvdplus_set3_allreduce_2`): in a tf.function, unique in the function; in a
    tf.compat.v1 graph, unique in it and the functions it holds.

    NotInitializedError, and require_member's errors for a set this rank may not use, are
    raised here: when the call is made or traced, not when a graph runs."""
    require_member(process_set, f"{kind}()")
    if name is not None:
        return str(name)
    if tf.executing_eagerly():
        return name_in(process_set, kind, None, f"{kind}()")
    # Numbered apart per set, so that ranks whose graphs hold other sets' collectives (one
    # set's ranks trace other code than another's) still agree on the job's names.
    scope = "hvdplus" if is_job(process_set) else f"hvdplus_set{process_set.process_set_id}"
    graph = tf.compat.v1.get_default_graph()
    if not tf.compat.v1.executing_eagerly_outside_functions():
        # The functions a tf.compat.v1 graph holds (tf.cond's branches, tf.function) run
        # beside its other ops, so their collectives take names unique in that whole graph.
        while getattr(graph, "outer_graph", None) is not None:
            graph = graph.outer_graph
    return graph.unique_name(f"{scope}_{kind}")


def what(kind: str, name) -> str:
    """The collective as error messages name it."""
    return f"{kind} '{name}'" if name else kind
