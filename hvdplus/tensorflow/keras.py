"""`import hvdplus.tensorflow.keras as hvd`: Horovod's module path for tf.keras.

Since TensorFlow 2.16, tf.keras is Keras 3, which `hvdplus.keras` serves; a script written
against `horovod.tensorflow.keras` gets that very module here (one module under two names,
so its state and classes are shared), callbacks and elastic included. `hvdplus.keras` sits above this
package, so this path looks it up by name when a script imports it: nothing in
`hvdplus.tensorflow` depends on it.
"""

import importlib
import sys

_keras = importlib.import_module("hvdplus.keras")
sys.modules[__name__ + ".callbacks"] = _keras.callbacks
sys.modules[__name__ + ".elastic"] = _keras.elastic
sys.modules[__name__] = _keras
