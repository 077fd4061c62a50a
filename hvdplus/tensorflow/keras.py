"""`import hvdplus.tensorflow.keras as hvd`: Horovod's module path for tf.keras, whichever
Keras that is.

Since TensorFlow 2.16, tf.keras is Keras 3, which `hvdplus.keras` serves; a script written
against `horovod.tensorflow.keras` gets that very module here (one module under two names,
so its state and classes are shared), callbacks and elastic included. Under
`TF_USE_LEGACY_KERAS=1` with `tf-keras` installed, tf.keras is tf_keras (Keras 2), and the
module is `hvdplus.tensorflow.keras2` instead. The choice is made once, at the first import,
from what tf.keras is then. `hvdplus.keras` sits above this package, so this path looks it
up by name when a script imports it: nothing in `hvdplus.tensorflow` depends on it.
"""

import importlib
import sys

import tensorflow as tf


def _serving_module() -> str:
    """The hvdplus module for the Keras that tf.keras is (whose own name may read
    `tensorflow.keras` whichever it is)."""
    return "hvdplus.tensorflow.keras2" if tf.keras.Model.__module__.startswith("tf_keras.") else "hvdplus.keras"


_keras = importlib.import_module(_serving_module())
sys.modules[__name__ + ".callbacks"] = _keras.callbacks
sys.modules[__name__ + ".elastic"] = _keras.elastic
sys.modules[__name__] = _keras
