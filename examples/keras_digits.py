"""A Keras 3 CNN on scikit-learn's digits, trained with model.fit on every rank.

    KERAS_BACKEND=torch      hvdplusrun -np 2 python examples/keras_digits.py
    KERAS_BACKEND=tensorflow hvdplusrun -np 2 python examples/keras_digits.py
    KERAS_BACKEND=jax        hvdplusrun -np 2 python examples/keras_digits.py

Each rank fits its own shard; hvdplus averages the gradients, starts every rank from rank 0's
weights, warms the learning rate up to its size-scaled value, averages the validation
metrics, and lets rank 0 alone print progress and write the best checkpoint.
"""

import argparse
import os
import tempfile

import keras
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvdplus.keras as hvd


def build_model():
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.001, help="learning rate of one rank")
    parser.add_argument("--checkpoint", default=os.path.join(tempfile.gettempdir(), "keras_digits_best.keras"))
    args = parser.parse_args()

    hvd.init()  # Keras prints on rank 0 only from here on
    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]
    x_train, x_val, y_train, y_val = train_test_split(x, digits.target, test_size=0.25, random_state=0,
                                                      stratify=digits.target)
    x_shard, y_shard = x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()]
    x_val_shard, y_val_shard = x_val[hvd.rank()::hvd.size()], y_val[hvd.rank()::hvd.size()]

    keras.utils.set_random_seed(hvd.rank())  # deliberately different: the broadcast aligns them
    model = build_model()
    scaled_lr = args.lr * hvd.size()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(scaled_lr)),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank=0),
        hvd.callbacks.MetricAverageCallback(),  # first, so the others see averaged metrics
        hvd.callbacks.LearningRateWarmupCallback(scaled_lr, warmup_epochs=2),
        hvd.callbacks.BestModelCheckpoint(args.checkpoint, monitor="val_accuracy", mode="max"),
    ]
    history = model.fit(x_shard, y_shard, batch_size=args.batch_size, epochs=args.epochs,
                        validation_data=(x_val_shard, y_val_shard), callbacks=callbacks, verbose=2)
    if hvd.rank() == 0:
        print(f"final validation accuracy {history.history['val_accuracy'][-1]:.4f} "
              f"(backend {keras.backend.backend()}, {hvd.size()} ranks, best model in {args.checkpoint})")


if __name__ == "__main__":
    main()
