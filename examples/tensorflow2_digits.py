"""Data-parallel training of a small CNN on scikit-learn's bundled digits with hvdplus.tensorflow.

    hvdplusrun -np 2 python examples/tensorflow2_digits.py --checkpoint checkpoints/digits.weights.h5

A custom training loop: every rank trains on its own part of each epoch, the training step
is a tf.function, and DistributedGradientTape averages the gradients across ranks. The test
metrics are summed over every rank's shard of the test set. Rank 0 alone prints and writes
the checkpoint.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import hvdplus.tensorflow as hvd  # noqa: E402


def digits_cnn(num_classes=10):
    """Two 3x3 convolutions on the 8x8 image, one pooling step, two dense layers."""
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(num_classes),
    ])


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="rows per step on each rank")
    parser.add_argument("--lr", type=float, default=0.002, help="Adam's learning rate for one rank; scaled by size()")
    parser.add_argument("--seed", type=int, default=42, help="seed of the split, the shuffling and the model")
    parser.add_argument("--checkpoint", default=None, help="path (*.weights.h5) rank 0 saves the weights to")
    args = parser.parse_args()
    if args.epochs < 1:
        parser.error(f"--epochs must be at least 1, got {args.epochs}")
    return args


def digits_arrays(seed):
    """The 1797 digits as 8x8x1 float images in [0, 1], split 75/25 the same way on every rank."""
    digits = load_digits()
    images = (digits.images / 16.0).astype("float32")[..., None]
    return train_test_split(images, digits.target.astype("int64"), test_size=0.25, random_state=seed,
                            stratify=digits.target)


def epoch_batches(images, labels, batch_size, epoch, seed):
    """This rank's batches of one epoch: a shuffle every rank draws alike, of which rank r takes
    every size()-th row. Every rank gets the same number of rows, so the same number of steps
    (each step all-reduces, so a rank with one step more would wait for the others forever)."""
    order = np.random.default_rng([seed, epoch]).permutation(len(images))
    order = order[: len(order) // hvd.size() * hvd.size()][hvd.rank()::hvd.size()]
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        yield images[rows], labels[rows]


def main():
    args = parse_args()
    hvd.init()
    keras.utils.set_random_seed(args.seed)
    is_root = hvd.rank() == 0
    train_x, test_x, train_y, test_y = digits_arrays(args.seed)

    model = digits_cnn()
    # Each rank's batch is args.batch_size rows, so a step sees size() times as many: scale lr.
    optimizer = keras.optimizers.Adam(args.lr * hvd.size())
    optimizer.build(model.trainable_variables)
    hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(reduce_retracing=True)
    def train_step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    def evaluate():
        """Test loss and accuracy over all ranks' shards: sums are all-reduced, then divided."""
        images, labels = test_x[hvd.rank()::hvd.size()], test_y[hvd.rank()::hvd.size()]
        logits = model(images, training=False)
        totals = tf.constant([float(loss_fn(labels, logits)) * len(labels),
                              float(np.sum(np.argmax(logits, axis=1) == labels)), len(labels)], tf.float64)
        loss_sum, correct, rows = hvd.allreduce(totals, op=hvd.Sum, name="test_totals").numpy()
        return loss_sum / rows, correct / rows

    if is_root:
        print(f"ranks {hvd.size()}  train rows {len(train_x)}  test rows {len(test_x)}  "
              f"lr {args.lr * hvd.size():g}", flush=True)
    for epoch in range(args.epochs):
        loss_sum, rows = 0.0, 0
        for images, labels in epoch_batches(train_x, train_y, args.batch_size, epoch, args.seed):
            loss_sum += float(train_step(images, labels)) * len(labels)
            rows += len(labels)
        train_loss_sum, train_rows = hvd.allreduce(tf.constant([loss_sum, rows], tf.float64), op=hvd.Sum,
                                                   name="train_totals").numpy()
        test_loss, test_accuracy = evaluate()
        if is_root:
            print(f"epoch {epoch + 1}  train loss {train_loss_sum / train_rows:.4f}  "
                  f"test loss {test_loss:.4f}  test accuracy {test_accuracy:.4f}", flush=True)
            if args.checkpoint:
                os.makedirs(os.path.dirname(args.checkpoint) or ".", exist_ok=True)
                model.save_weights(args.checkpoint)

    if is_root:
        if args.checkpoint:
            print(f"checkpoint written to {args.checkpoint}")
        print(f"final test accuracy {test_accuracy:.4f}", flush=True)


if __name__ == "__main__":
    main()
