"""Hybrid data parallelism: tf.distribute.MirroredStrategy inside each process, hvdplus across them.

    hvdplusrun -np 2 python examples/tensorflow2_mirrored.py --devices-per-process 2

Each process splits its CPU into logical devices (on a GPU machine: its GPUs) and runs one
replica on each; hvd.CrossDeviceOps() adds up the replicas' gradients within the process and
averages them across processes, so Keras' model.fit trains one model on all processes x
devices replicas. Every process fits its own shard of scikit-learn's digits; rank 0 alone
logs. At the end every process checks that all hold the same weights.
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


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices-per-process", type=int, default=2, help="logical CPU devices, one replica each")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="rows per step on each process (all its replicas)")
    parser.add_argument("--lr", type=float, default=0.002, help="Adam's learning rate for one process; scaled by size")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    if args.devices_per_process < 1:
        parser.error(f"--devices-per-process must be at least 1, got {args.devices_per_process}")
    return args


def split_cpu(devices):
    """Make `devices` logical CPUs. This must come before TensorFlow starts its runtime (at the
    first tensor or list of logical devices; importing TensorFlow, Keras or hvdplus does not)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * devices)
    return [device.name for device in tf.config.list_logical_devices("CPU")]


def main():
    args = parse_args()
    devices = split_cpu(args.devices_per_process)
    hvd.init()
    is_root = hvd.rank() == 0
    keras.utils.set_random_seed(args.seed)

    digits = load_digits()
    images = (digits.images / 16.0).astype("float32")[..., None]
    train_x, test_x, train_y, test_y = train_test_split(images, digits.target, test_size=0.25,
                                                        random_state=args.seed, stratify=digits.target)
    # Equal shards of whole batches: every process takes the same number of steps, and no
    # replica gets an empty share of a short last batch (TensorFlow 2.21's oneDNN MaxPooling
    # gradient aborts the process on one).
    rows = len(train_x) // (hvd.size() * args.batch_size) * hvd.size() * args.batch_size
    shard_x, shard_y = train_x[hvd.rank():rows:hvd.size()], train_y[hvd.rank():rows:hvd.size()]

    strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=hvd.CrossDeviceOps())
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ])
        model.compile(optimizer=keras.optimizers.Adam(args.lr * hvd.size()),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    hvd.broadcast_variables(model.variables, root_rank=0)
    if is_root:
        print(f"processes {hvd.size()}  devices per process {len(devices)}  "
              f"replicas per step {hvd.size() * strategy.num_replicas_in_sync}  "
              f"rows per step {hvd.size() * args.batch_size}", flush=True)
    model.fit(shard_x, shard_y, batch_size=args.batch_size, epochs=args.epochs, shuffle=True,
              verbose=2 if is_root else 0)

    # Test metrics over every process' shard: sums all-reduced, then divided.
    test_images, test_labels = test_x[hvd.rank()::hvd.size()], test_y[hvd.rank()::hvd.size()]
    correct = float(np.sum(np.argmax(model.predict(test_images, verbose=0), axis=1) == test_labels))
    correct, total = hvd.allreduce(tf.constant([correct, len(test_labels)], tf.float64), op=hvd.Sum).numpy()
    checksums = hvd.allgather_object(float(sum(np.sum(w, dtype=np.float64) for w in model.get_weights())))
    if is_root:
        agreement = "identical" if len(set(checksums)) == 1 else f"DIFFERENT ({checksums})"
        print(f"weights {agreement} on all {hvd.size()} processes", flush=True)
        print(f"final test accuracy {correct / total:.4f}", flush=True)


if __name__ == "__main__":
    main()
