"""The handle an async collective returns: poll it, or synchronize to get the result."""

__all__ = ["Handle", "HandleGroup", "chained"]


class Handle:
    """Completion of one named operation, set once by whichever thread runs the engine.

    Handles are cheap (no lock or event of their own, since a training step makes hundreds):
    waiting goes through the engine, which first drives itself from the waiting thread and
    then sleeps on one condition that every completion notifies.
    """

    __slots__ = ("name", "_done", "_result", "_error", "_finish", "_engine")

    def __init__(self, name: str, engine, finish=None):
        self.name = name
        self._done = False
        self._result = None
        self._error = None
        self._engine = engine
        # Turns the engine's output into what the caller asked for (e.g. a tensor), on wait().
        self._finish = finish

    def then(self, step):
        """Have wait() pass the result through `step` too, after this handle's own finishing
        step: adapters turn the core's arrays into their tensors this way. Returns the handle."""
        self._finish = chained(self._finish, step)
        return self

    def __repr__(self):
        return f"<hvdplus.Handle {self.name!r} {'done' if self._done else 'pending'}>"

    def set_result(self, result) -> None:
        """Called by the engine, which then notifies its waiters."""
        self._result = result
        self._done = True

    def set_error(self, error: BaseException) -> None:
        self._error = error
        self._done = True

    def done(self) -> bool:
        return self._done

    def poll(self) -> bool:
        """Whether done, after giving the engine one step from this thread (see Engine.poll)."""
        return self._done or self._engine.poll(self)

    def wait(self):
        """Block until done; return the result or raise the operation's error."""
        if not self._done:
            self._engine.wait_for(self)
        if self._error is not None:
            raise self._error
        return self._finish(self._result) if self._finish is not None else self._result


def chained(first, second):
    """`second` after `first` (None: no first step), as one finishing step of a handle."""
    return second if first is None else lambda result: second(first(result))


class HandleGroup:
    """Several handles that complete as one: `wait()` returns their results as a list (passed
    through the steps `then` chains on, as for a Handle)."""

    __slots__ = ("name", "handles", "_finish")

    def __init__(self, name: str, handles):
        self.name = name
        self.handles = list(handles)
        self._finish = None

    def then(self, step):
        self._finish = chained(self._finish, step)
        return self

    def __repr__(self):
        return f"<hvdplus.HandleGroup {self.name!r} of {len(self.handles)}>"

    def done(self) -> bool:
        return all(handle.done() for handle in self.handles)

    def poll(self) -> bool:
        return all([handle.poll() for handle in self.handles])

    def wait(self):
        results = [handle.wait() for handle in self.handles]
        return self._finish(results) if self._finish is not None else results
