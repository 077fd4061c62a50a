"""`import hvdplus.tensorflow.keras as hvd`: Horovod's module path for tf.keras.

Since TensorFlow 2.16, tf.keras is Keras 3, which `hvdplus.keras` serves; a script written
against `horovod.tensorflow.keras` gets that very module here (one module under two names,
so its state and classes are shared), callbacks included.
"""

import sys

from .. import keras as _keras
from ..keras import callbacks as _callbacks

sys.modules[__name__ + ".callbacks"] = _callbacks
sys.modules[__name__] = _keras
