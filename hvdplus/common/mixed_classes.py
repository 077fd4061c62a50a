"""The class of a wrapped object: a subclass of the object's own class with an hvdplus mixin
before it, which keeps that class' name, module and docstring (a saved Keras model then
records the user's optimizer class, which loading wraps again)."""

from typing import Dict, Tuple

__all__ = ["mixed_class"]

_MADE: Dict[Tuple[type, type], type] = {}


def mixed_class(mixin: type, cls: type) -> type:
    """The subclass of `cls` with `mixin` first: one per pair, made once and kept, so that
    every object wrapped alike shares its class."""
    made = _MADE.get((mixin, cls))
    if made is None:
        made = _MADE[(mixin, cls)] = type(cls.__name__, (mixin, cls), {"__module__": cls.__module__,
                                                                       "__doc__": cls.__doc__})
    return made
