"""Horovod's `local_layers` argument (PartialDistributedGradientTape, PartialDistributedOptimizer):
the layers whose gradients each rank keeps to itself."""

from typing import List

__all__ = ["local_layer_variables"]


def local_layer_variables(local_layers, layer_class, class_name: str) -> List:
    """The trainable variables of `local_layers` (None, one `layer_class` instance, or a
    collection of them); ValueError, with Horovod's words (naming `class_name`), for anything
    else."""
    if local_layers is None:
        return []
    if isinstance(local_layers, layer_class):
        local_layers = [local_layers]
    elif not all(isinstance(layer, layer_class) for layer in local_layers):
        raise ValueError(f"All local layers must be of {class_name} type.")
    return [variable for layer in local_layers for variable in layer.trainable_weights]
