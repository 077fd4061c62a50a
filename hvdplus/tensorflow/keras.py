"""`import hvdplus.tensorflow.keras as hvd`: Horovod's module path for tf.keras, whichever
Keras that is.

Since TensorFlow 2.16, tf.keras is Keras 3, which `hvdplus.keras` serves; a script written
against `horovod.tensorflow.keras` gets that very module here (one module under two names,
so its state and classes are shared), callbacks and elastic included. Under
`TF_USE_LEGACY_KERAS=1` with `tf-keras` installed, tf.keras is tf_keras (Keras 2), and the
module is `hvdplus.tensorflow.keras2` instead. The choice is made once, at the first import,
from what tf.keras is then, by hvdplus.horovod_keras: `hvdplus.keras` sits above this
package, so the Horovod-compat layer above both chooses, and this path only takes its name.
"""

import sys

from ..horovod_keras import tf_keras_adapter

_adapter = tf_keras_adapter()
sys.modules[__name__ + ".callbacks"] = _adapter.callbacks
sys.modules[__name__ + ".elastic"] = _adapter.elastic
sys.modules[__name__] = _adapter
