"""Horovod's build queries, for scripts that ask them before choosing a device, a transport
or an op (`if hvd.nccl_built(): ...`). hvdplus is pure Python over MPI: it is built with
none of these libraries. Like Horovod's, they answer before `init()`.
"""

__all__ = ["gloo_built", "gloo_enabled", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
           "rocm_built", "sycl_built", "gpu_available"]


def nccl_built() -> int:
    """0, the answer of a Horovod built without NCCL (one built with it returns NCCL's version code)."""
    return 0


def gloo_enabled() -> bool:
    """False: MPI is the transport; there is no Gloo controller to enable."""
    return False


def _built_without() -> bool:
    """False: hvdplus is built without this library."""
    return False


gloo_built = ddl_built = ccl_built = cuda_built = rocm_built = sycl_built = _built_without


def gpu_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Horovod's question whether its extension for a framework runs with a GPU: False, for
    every framework, since hvdplus has no GPU build (CUDA tensors are staged through host
    memory).

    Args:
        ext_base_name: the framework's extension, as Horovod names it ("torch", "tensorflow").
        verbose: also print the answer, as Horovod's does.
    """
    if verbose:
        print(f"hvdplus: extension {ext_base_name} was NOT built with GPU support "
              "(hvdplus stages GPU tensors through host memory)")
    return False
