"""The API that users and the framework adapters see: init and shutdown, the runtime's
queries, process sets, and the collectives and point-to-point messages on numpy arrays.

Everything here describes a call and hands it to the engine (`hvdplus.engine`), which
negotiates, fuses and runs it; adapters never reach past this package into the engine's
machinery or a runtime's attributes."""
