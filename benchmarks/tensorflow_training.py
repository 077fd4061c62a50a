"""TensorFlow 2 training throughput with hvdplus against tf.distribute and communication-free ranks.

    hvdplusrun -np 2 python benchmarks/tensorflow_training.py
    hvdplusrun -np 2 python benchmarks/tensorflow_training.py --only-multiworker

For each of the models in keras_models (an 8 x 256 MLP, batch 64 per process, and a
ResNet-style CNN, batch 32), synthetic data and one intra-op and one inter-op thread per
process, measures in one job:
  (a) model.fit under tf.distribute.MirroredStrategy (one CPU device per process) with
      hvd.CrossDeviceOps(), timed between batch ends inside the fit (harness.fit_runner),
      its batches read on the host (see per_replica_batches);
  (b) a custom tf.function loop with hvd.DistributedGradientTape;
  (c) tf.distribute.MultiWorkerMirroredStrategy (TF_CONFIG on two loopback ports that rank 0
      picks and broadcasts before TensorFlow starts), as a custom loop of strategy.run inside
      tf.function: Keras 3's model.fit fails under it upstream (keras-team/keras#20585);
  (d) every process training its own copy with a plain custom loop ("independent ranks", what
      this machine can give n processes at all);
  (e) one process alone;
  (f) the naive peer: (b)'s loop with the gradients handed to numpy in one tf.numpy_function
      and each all-reduced there by mpi4py, one by one;
  (g) every process running its own plain model.fit, no strategy and no communication: (a)'s
      own baseline, since a fit costs more than a custom loop (callbacks, metrics, its input).
(a), (b), (d), (e), (f) and (g) take turns, round after round (harness.interleaved_throughputs),
so that drift in the machine's speed hits them alike. Prints samples/s of all processes
together, scaling efficiency = (b)/(d), (f)/(d), and (a)/(g) beside (a)/(d), and ratios to
(f) and (c); writes the same to benchmarks/results/tensorflow_training_np<ranks>.csv, or with
--only-multiworker to tensorflow_training_multiworker_np<ranks>.csv (see
harness.write_results), where a failed (c) is a row whose `failure` column says why.

TensorFlow configures its collective ops once per process, before its runtime starts
("Collective ops must be configured at program startup" otherwise), so (c)'s strategy is
created first, before any tensor, and measured last; (a), (b), (d) and (e) run in the same
context without trouble. Creating and measuring (c) each run in a thread with a time limit:
a failure or a hang is printed as "MultiWorkerMirroredStrategy: failed (<reason>)" and the
other measurements stand. --only-multiworker measures (c) alone.
"""

import argparse
import json
import os
import socket
import threading

os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from harness import (add_csv_option, array_batches, fit_runner, interleaved_throughputs,  # noqa: E402
                     mpi4py_average, print_throughput_rows, ratio, throughput, throughput_rows, write_results)
from mpi4py import MPI  # noqa: E402

WORLD = MPI.COMM_WORLD


def free_loopback_ports(count):
    """`count` ports free on 127.0.0.1 at the time of asking."""
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def set_tf_config(comm):
    """TF_CONFIG for one worker per process on loopback ports chosen by rank 0."""
    ports = comm.bcast(free_loopback_ports(comm.Get_size()) if comm.Get_rank() == 0 else None, root=0)
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"localhost:{port}" for port in ports]},
        "task": {"type": "worker", "index": comm.Get_rank()},
    })


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,cnn", help="comma-separated names from keras_models.MODELS")
    parser.add_argument("--steps", type=int, help="steps per timed round (default: the model's own)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds in which all but (c) take turns")
    parser.add_argument("--multiworker-timeout", type=float, default=90.0,
                        help="seconds (c) may take before it is reported as failed")
    parser.add_argument("--only-multiworker", action="store_true", help="run (c) alone")
    add_csv_option(parser)
    return parser.parse_args()


ARGS = parse_args()
set_tf_config(WORLD)  # before TensorFlow starts

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdplus.tensorflow as hvd  # noqa: E402
from keras_models import MODELS, synthetic_data  # noqa: E402

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def optimizer():
    return keras.optimizers.SGD(0.01, momentum=0.9)


def custom_loop(step, x, y):
    """run(n): n calls of the tf.function `step` on the same batch."""
    def run(n):
        for _ in range(n):
            step(x, y)
    return run


def mirrored_fit(build_model, x, y, batch):
    """(a) model.fit under MirroredStrategy, one CPU device per process, hvdplus across processes."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"], cross_device_ops=hvd.CrossDeviceOps())
    with strategy.scope():
        model = build_model()
        model.compile(optimizer=optimizer(), loss=LOSS)
    hvd.broadcast_variables(model.variables, root_rank=0)
    return fit_runner(model, per_replica_batches(strategy, x, y, batch))


def independent_fit(build_model, x, y, batch):
    """(g) a plain model.fit in every process: no strategy, no communication."""
    model = build_model()
    model.compile(optimizer=optimizer(), loss=LOSS)
    return fit_runner(model, array_batches(x, y, batch))


def per_replica_batches(strategy, x, y, batch):
    """`data_for` (harness.fit_runner) under `strategy`: the first n batches, each replica
    reading its dataset on the host. With the default input, every fit builds a
    MultiDeviceIterator, whose background thread can crash the process (SIGSEGV in
    DatasetBaseIterator::GetNext) when it also holds (c)'s MultiWorkerMirroredStrategy and
    runs the other loops between fits; these host datasets build no such iterator."""
    options = tf.distribute.InputOptions(
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
        experimental_fetch_to_device=False)

    def data_for(n):
        def dataset(context):
            return tf.data.Dataset.from_tensor_slices((x[:n * batch], y[:n * batch])).batch(batch)

        return {"x": strategy.distribute_datasets_from_function(dataset, options), "shuffle": False}

    return data_for


def gradient_tape_loop(build_model, x, y, reduce=None):
    """(b) with reduce="hvdplus" (hvd.DistributedGradientTape), (f) with "mpi4py", (d) and
    (e) with None: a plain tape."""
    model, opt = build_model(), optimizer()
    opt.build(model.trainable_variables)
    if reduce:
        hvd.broadcast_variables(model.variables + opt.variables, root_rank=0)

    @tf.function
    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = LOSS(labels, model(images, training=True))
        if reduce == "hvdplus":
            tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        if reduce == "mpi4py":
            grads = tf.numpy_function(mpi4py_average, grads, [g.dtype for g in grads], stateful=True)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return custom_loop(step, x, y)


def multiworker_strategy():
    """MultiWorkerMirroredStrategy from TF_CONFIG, ring collectives over gRPC on loopback."""
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def multiworker_loop(strategy, build_model, x, y, batch):
    """(c) strategy.run of a tape step inside tf.function, the loss averaged over the global batch."""
    global_batch = batch * strategy.num_replicas_in_sync
    with strategy.scope():
        model, opt = build_model(), optimizer()
        opt.build(model.trainable_variables)

    def replica_step(images, labels):
        with tf.GradientTape() as tape:
            per_row = keras.losses.sparse_categorical_crossentropy(labels, model(images, training=True),
                                                                   from_logits=True)
            loss = tf.nn.compute_average_loss(per_row, global_batch_size=global_batch)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    @tf.function
    def step(images, labels):
        return strategy.run(replica_step, args=(images, labels))

    return custom_loop(step, x, y)


def guarded(work, timeout):
    """`work(comm)` in a daemon thread on a communicator of its own, for at most `timeout` seconds.

    Returns (result, None, False), or on every rank (None, reason, hung) where any rank failed
    or timed out; hung says whether this rank's thread is still running.
    """
    comm = WORLD.Dup()
    outcome = {}

    def target():
        try:
            outcome["value"] = work(comm)
        except Exception as error:  # reported, not raised: the other measurements stand
            outcome["error"] = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    reason = outcome.get("error") or (None if "value" in outcome else f"no result after {timeout:g} s")
    failures = [f"rank {rank}: {text}" for rank, text in enumerate(WORLD.allgather(reason)) if text]
    if failures:
        return None, "; ".join(failures), thread.is_alive()
    return outcome["value"], None, False


def result_rows(results, multiworker_error, name, model, steps):
    """throughput_rows of one model (its name in MODELS, its BenchmarkModel), and (c)'s
    failure as a row of its own."""
    ratios = []
    if "(d) independent ranks" in results:
        ratios += [ratio(results, run, "(d) independent ranks") for run in
                   ("(b) DistributedGradientTape", "(a) MirroredStrategy fit + hvdplus", "(f) mpi4py loop")]
        ratios.append(ratio(results, "(a) MirroredStrategy fit + hvdplus", "(g) independent model.fit"))
        ratios += [ratio(results, run, "(f) mpi4py loop")
                   for run in ("(b) DistributedGradientTape", "(a) MirroredStrategy fit + hvdplus")]
    multiworker = "(c) MultiWorkerMirroredStrategy"
    if multiworker in results:
        ratios += [ratio(results, run, multiworker) for run in results if run != multiworker]
    columns = {"model": name, "batch_per_rank": model.batch, "steps": steps}
    rows = throughput_rows(results, ratios, **columns)
    if multiworker_error:
        rows.append({**columns, "run": multiworker, "samples_per_s": None, "baseline": None, "ratio": None,
                     "failure": multiworker_error})
    return rows


def report(rows, model):
    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}, {hvd.size()} processes x 1 thread, "
          f"{model.label}, batch {model.batch} per process; samples/s of all processes together")
    for row in rows:
        if row.get("failure"):
            print(f"MultiWorkerMirroredStrategy: failed ({row['failure']})")
    print_throughput_rows([row for row in rows if not row.get("failure")])


def measure(strategy, model):
    """Results of (a)-(g) for one BenchmarkModel, and (c)'s failure if any; whether (c) hung."""
    batch, steps = model.batch, ARGS.steps or model.steps
    x, y = synthetic_data(model, batch * steps, seed=hvd.rank())
    x_batch, y_batch = tf.constant(x[:batch]), tf.constant(y[:batch])
    results, error, hung = {}, None, False
    if not ARGS.only_multiworker:
        alone = gradient_tape_loop(model.build, x_batch, y_batch)
        results = interleaved_throughputs({
            "(a) MirroredStrategy fit + hvdplus": (mirrored_fit(model.build, x, y, batch), hvd.size()),
            "(b) DistributedGradientTape": (gradient_tape_loop(model.build, x_batch, y_batch, "hvdplus"), hvd.size()),
            "(f) mpi4py loop": (gradient_tape_loop(model.build, x_batch, y_batch, "mpi4py"), hvd.size()),
            "(g) independent model.fit": (independent_fit(model.build, x, y, batch), hvd.size()),
            "(d) independent ranks": (alone, hvd.size()),
            "(e) one process alone": (lambda n: alone(n) if hvd.rank() == 0 else None, 1),
        }, batch, steps, rounds=ARGS.rounds)
    if strategy is not None:
        value, error, hung = guarded(
            lambda comm: throughput(multiworker_loop(strategy, model.build, x_batch, y_batch, batch), batch,
                                    steps, comm.Get_size(), comm),
            ARGS.multiworker_timeout)
        if value is not None:
            results["(c) MultiWorkerMirroredStrategy"] = value
    return results, error, hung


def main():
    # TensorFlow configures collective ops once, before its runtime starts: (c)'s strategy first.
    strategy, error, hung = guarded(lambda comm: multiworker_strategy(), ARGS.multiworker_timeout)
    hvd.init()
    rows = []
    for name in ARGS.models.split(","):
        model = MODELS[name]
        results, model_error, model_hung = measure(strategy, model)
        model_rows = result_rows(results, error or model_error, name, model, ARGS.steps or model.steps)
        if hvd.rank() == 0:
            report(model_rows, model)
        rows += model_rows
        if model_hung:
            # A hung TensorFlow collective leaves (c)'s strategy unusable: the models after
            # this one report that failure instead of measuring (c).
            strategy, error, hung = None, model_error, True
    benchmark = "tensorflow_training_multiworker" if ARGS.only_multiworker else "tensorflow_training"
    write_results(benchmark, rows, {"tensorflow": tf.__version__, "keras": keras.__version__}, ARGS.csv)
    if WORLD.allreduce(hung, op=MPI.LOR):
        hvd.shutdown()
        MPI.Finalize()
        os._exit(0)  # a hung TensorFlow collective would keep the interpreter from exiting


if __name__ == "__main__":
    main()
