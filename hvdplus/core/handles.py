"""What the async collectives return: a `Handle` per operation and a `HandleGroup` for
several, which adapters chain their finishing steps onto (`Handle.then`). How a handle
completes is the engine's (hvdplus.engine.handles)."""

from ..engine.handles import Handle, HandleGroup

__all__ = ["Handle", "HandleGroup"]
