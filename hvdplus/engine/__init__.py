"""The engine's machinery: the background thread that negotiates, fuses and runs every
collective in the same order on all ranks (the tensor queue, negotiation, the response
cache, the stall inspector, fusion, the executor, handles, the timeline and autotune), and
the spec of each collective kind. The API on top of it is `hvdplus.core`."""
