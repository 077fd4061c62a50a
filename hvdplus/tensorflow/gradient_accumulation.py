"""Gradient accumulation for optimizers that compute their own gradients (tf_keras' and
tf.compat.v1.train's, wrapped with `backward_passes_per_step=N`), as Horovod's do: each
pass's gradients are added up on this rank, the sums are all-reduced once, on the N-th pass,
and the optimizer applies them then.

It runs eagerly, inside tf.function and in a tf.compat.v1 graph: the sums and the pass count
are variables, and the all-reduce sits in a `tf.cond` on the count. Every rank must take the
same number of passes, so that the N-th pass, and its all-reduce, comes at the same step.
"""

import tensorflow as tf

__all__ = ["GradientAccumulation", "allreduced_or_accumulated"]


class GradientAccumulation:
    """The sums of the gradients since the last update, one variable per model variable, and
    the number of passes they hold.

    Args:
        passes: backward passes per update, above 1.
        average: divide the sums by `passes` (Horovod's average_aggregated_gradients) instead
            of applying them whole.
        allreduce: `allreduce(gradients, variables)`, the gradients reduced over the ranks.
        make_variable: `make_variable(initial_value, name)`, a new variable (Keras' session
            in a v1 graph initializes the variables Keras made).
    """

    def __init__(self, passes, average, allreduce, make_variable=None):
        if passes < 2:
            raise ValueError(f"backward_passes_per_step must be 1, or above to accumulate, not {passes}")
        self.passes = passes
        self._average = average
        self._allreduce = allreduce
        self._make_variable = make_variable or (lambda value, name: tf.Variable(value, trainable=False, name=name))
        self._sums = {}  # model variable ref -> the variable holding its gradients' sum
        self._count = None

    def add(self, grads, variables):
        """Add this pass's `grads` (None for no gradient) of `variables` to the sums. Returns
        what the optimizer is handed: on the N-th pass the sums all-reduced (and divided by N
        with `average`), which start again from zero; before it, this rank's sums so far,
        which `apply` does not apply."""
        grads = list(grads)
        present = [index for index, grad in enumerate(grads) if grad is not None]
        if not present:
            return grads
        sources = [variables[index] for index in present]
        sums = [self._sum_for(variables[index], grads[index]) for index in present]
        added = [total.assign_add(tf.convert_to_tensor(grads[index])) for total, index in zip(sums, present)]
        with tf.control_dependencies(added):
            count = self._counter().assign_add(1)

        def allreduced():
            reduced = self._allreduce([total.read_value() for total in sums], sources)
            if self._average:
                reduced = [grad / self.passes for grad in reduced]
            with tf.control_dependencies(reduced):
                cleared = [total.assign(tf.zeros_like(total)) for total in sums] + [self._count.assign(0)]
            with tf.control_dependencies(cleared):
                return [tf.identity(grad) for grad in reduced]

        def accumulated():
            return [total.read_value() for total in sums]

        results = tf.cond(tf.equal(count, self.passes), allreduced, accumulated)
        for index, result in zip(present, tf.nest.flatten(results)):
            grads[index] = result
        return grads

    def apply(self, grads, apply_gradients, count_pass):
        """`apply_gradients()` on the pass that all-reduced `grads` (what `add` returned: the
        count is back at 0); on the others `count_pass()`, which counts the pass in the
        optimizer's step counter, as Horovod does, so that schedules see every pass. In a v1
        graph each must return the op or tensor that does its work (an assign with
        `read_value=False`); elsewhere what it returns does not matter."""

        def run(step):
            done = step()
            # A v1 graph runs only the ops an output needs; tf.function runs them all anyway.
            with tf.control_dependencies([done] if isinstance(done, (tf.Operation, tf.Tensor)) else []):
                return tf.constant(True)

        # The count is read after `add` has counted this pass (a v1 graph orders only what depends).
        with tf.control_dependencies([grad for grad in grads if isinstance(grad, tf.Tensor)]):
            applying = tf.equal(self._counter().read_value(), 0)
        return tf.cond(applying, lambda: run(apply_gradients), lambda: run(count_pass))

    def _counter(self):
        if self._count is None:
            self._count = self._variable(lambda: tf.constant(0, tf.int64), "passes")
        return self._count

    def _sum_for(self, variable, grad):
        key = variable.ref()
        if key not in self._sums:
            shape, dtype = variable.shape, grad.dtype
            self._sums[key] = self._variable(lambda: tf.zeros(shape, dtype), "gradient_sum")
        return self._sums[key]

    def _variable(self, initial_value, name):
        # Made where the model's are, outside the tf.function that first asks for it (and so
        # is its initial value).
        with tf.init_scope():
            return self._make_variable(initial_value(), name)


def allreduced_or_accumulated(grads_and_vars, allreduce, accumulation=None):
    """(gradient, variable) pairs, the gradients all-reduced by `allreduce(grads, variables)`,
    or, given an `accumulation`, what its `add` returns for them."""
    grads_and_vars = list(grads_and_vars)
    grads = [grad for grad, _ in grads_and_vars]
    variables = [variable for _, variable in grads_and_vars]
    grads = accumulation.add(grads, variables) if accumulation is not None else allreduce(grads, variables)
    return list(zip(grads, variables))
