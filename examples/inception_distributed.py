"""TensorFlow's distributed Inception trainer on psflow: sync replicas with a backup worker, RMSProp, a learning rate
decayed by epochs, moving averages for evaluation.

TensorFlow's ``inception_distributed_train.py`` is between-graph replication:
every worker task runs its own copy of the training graph against variables on
the ps tasks. Its shape, and what psflow runs for each piece:

* ``SyncReplicasOptimizer(replicas_to_aggregate=N, total_num_replicas=N + B)``:
  each step averages the first N gradients that arrive and drops the B slowest
  (*backup workers*), on each ps task as TF's per-variable accumulators do
  (docs/replication.md) -- ``psflow train --mode sync --replicas-to-aggregate N
  --workers N+B`` (:mod:`psflow.ps.sync`);
* ``RMSPropOptimizer(lr, decay=0.9, momentum=0.9, epsilon=1.0)`` applied on the
  ps tasks -- ``--optimizer rmsprop:decay=0.9,momentum=0.9,epsilon=1.0``;
* ``lr = exponential_decay(initial, global_step, decay_steps, 0.94,
  staircase=True)`` with ``decay_steps = int(examples_per_epoch / (batch_size *
  replicas_to_aggregate) * num_epochs_per_decay)``: the rate drops by 0.94
  every 2 epochs of the *global* batch -- ``--learning-rate-schedule
  exponential_decay:decay_steps=...,decay_rate=0.94,staircase=true``;
* ``ExponentialMovingAverage(0.9999, global_step)`` of the variables, which
  Inception's evaluation restores in place of the variables --
  ``--moving-average-decay 0.9999 --eval-moving-averages``
  (:mod:`psflow.ps.averages`; ``psflow export --moving-averages`` for serving);
* the chief's summaries, the learning rate among them -- the ``learning_rate``
  scalar the chief writes to ``--summary-dir`` at every summary step.

The model is the CNN of ``examples/cnn_digits.py`` (:class:`DigitsCNN`) on
scikit-learn's bundled 8x8 digits (1,437 training and 360 held-out images;
nothing is downloaded). Run with no arguments, it trains a small local demo --
its own processes on 127.0.0.1 (1 ps task, 4 workers: 3 aggregated per step and
1 backup, 32 examples each), started by psflow's launcher
(:func:`psflow.launch.local.run_local`) on the CPU -- for 20 epochs of the global
batch of 96 (299 global steps, about 20 s), and prints the held-out accuracy
evaluated with the moving averages beside the accuracy of the variables
themselves (both 0.97-0.98), and the learning rate the chief recorded (0.045,
times 0.94 every 29 steps)::

    python examples/inception_distributed.py
    python examples/inception_distributed.py --in-process          # the same model in one process, batch 96
    python examples/inception_distributed.py --workers 8 --replicas-to-aggregate 6 --ps 2 --batch-size 64 \\
        --epochs 50 --channels 32,64 --hidden 128                   # scaled up: 2 backups, a wider CNN

``--in-process`` trains the same model with the same global batch
(``--replicas-to-aggregate x --batch-size``), the same schedule and as many
global steps in one process (``psflow train --in-process``): the yardstick of
the distributed run, whose accuracy agrees with it to within 0.01 (0.975 in
one process for the default seed, 0.969-0.981 over three distributed runs;
which worker is the backup changes from step to step, so the distributed run
is not repeatable to the bit; ``tests/integration/test_inception_distributed.py``).
On a machine with few cores each process gets one PyTorch thread
(``PSFLOW_TORCH_THREADS=1``, set here unless given).

The same run from the command line (``python -m examples.cnn_digits --train-shards 4`` writes the data)::

    psflow train --model examples.cnn_digits:DigitsCNN --format tfrecord --schema runs/digits/data/schema.yaml \\
        --train 'runs/digits/data/train-*.tfrecord' --eval runs/digits/data/test.tfrecord \\
        --mode sync --replicas-to-aggregate 3 --workers 4 --ps 1 --batch-size 32 --max-steps 299 --epochs 1000 \\
        --optimizer rmsprop:decay=0.9,momentum=0.9,epsilon=1.0 --learning-rate 0.045 \\
        --learning-rate-schedule exponential_decay:decay_steps=29,decay_rate=0.94,staircase=true \\
        --moving-average-decay 0.9999 --eval-moving-averages --checkpoint-dir runs/inception/ckpt
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

#: The directory holding ``examples/``: every task process imports the model from there.
ROOT = Path(__file__).resolve().parent.parent
MODEL = "examples.cnn_digits:DigitsCNN"
#: Inception's RMSProp (inception_distributed_train.py: RMSPROP_DECAY, RMSPROP_MOMENTUM, RMSPROP_EPSILON).
RMSPROP = {"decay": 0.9, "momentum": 0.9, "epsilon": 1.0}
#: Inception's moving-average decay (inception_model.MOVING_AVERAGE_DECAY).
MOVING_AVERAGE_DECAY = 0.9999
#: Inception's staircase decay: 0.94 every 2 epochs.
DECAY_RATE, EPOCHS_PER_DECAY = 0.94, 2.0


def cnn_digits() -> ModuleType:
    """``examples/cnn_digits.py`` (the model and the data), however this script is started."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("examples.cnn_digits")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="inception_distributed", description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=4, help="worker tasks, backups included (4)")
    p.add_argument("--replicas-to-aggregate", type=int, default=3,
                   help="gradients averaged per step; the other workers are backups (3)")
    p.add_argument("--ps", type=int, default=1, help="ps tasks (1)")
    p.add_argument("--batch-size", type=int, default=32, help="examples per worker and step (32)")
    p.add_argument("--epochs", type=float, default=20.0,
                   help="length of the run in epochs of the global batch: global steps = epochs x examples / "
                        "(replicas-to-aggregate x batch-size) (20)")
    p.add_argument("--learning-rate", type=float, default=0.045,
                   help="RMSProp's initial learning rate (0.045, Inception's distributed trainer's)")
    p.add_argument("--epochs-per-decay", type=float, default=EPOCHS_PER_DECAY,
                   help=f"the learning rate drops by --decay-rate every this many epochs ({EPOCHS_PER_DECAY})")
    p.add_argument("--decay-rate", type=float, default=DECAY_RATE, help=f"staircase decay factor ({DECAY_RATE})")
    p.add_argument("--moving-average-decay", type=float, default=MOVING_AVERAGE_DECAY,
                   help=f"decay of the variables' moving averages ({MOVING_AVERAGE_DECAY})")
    p.add_argument("--channels", default="8,16", help="output channels of the two convolutions (8,16)")
    p.add_argument("--hidden", type=int, default=32, help="units of the hidden dense layer (32)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model's initial values (0)")
    p.add_argument("--in-process", action="store_true",
                   help="train the same model in one process with the global batch (the distributed run's yardstick)")
    p.add_argument("--output-dir", help="where the data, checkpoints, summaries and logs go (default: a new temporary "
                   "directory)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def schedule(args: argparse.Namespace, examples_per_epoch: int) -> tuple[int, int, int]:
    """``(global_batch, decay_steps, max_steps)`` as Inception's trainer computes them from the global batch."""
    global_batch = args.batch_size * args.replicas_to_aggregate
    batches_per_epoch = examples_per_epoch / global_batch
    decay_steps = max(1, int(batches_per_epoch * args.epochs_per_decay))
    return global_batch, decay_steps, max(1, round(batches_per_epoch * args.epochs))


def train_config(args: argparse.Namespace, data: dict[str, Any], out: Path) -> Any:
    """The run's :class:`~psflow.train.config.TrainConfig` (what ``psflow train`` builds from its flags)."""
    from psflow.train.config import TrainConfig

    global_batch, decay_steps, max_steps = schedule(args, int(data["train_examples"]))
    common: dict[str, Any] = dict(
        train=tuple(data["train"]), eval=(data["test"],), format="tfrecord", schema=data["schema"],
        model=MODEL, model_path=str(ROOT),
        model_params={"channels": [int(c) for c in args.channels.split(",")], "hidden": args.hidden},
        optimizer="rmsprop", optimizer_params=dict(RMSPROP), learning_rate=args.learning_rate,
        learning_rate_schedule={"schedule": "exponential_decay", "decay_steps": decay_steps,
                                "decay_rate": args.decay_rate, "staircase": True},
        moving_average_decay=args.moving_average_decay, eval_moving_averages=True,
        epochs=None, max_steps=max_steps, seed=args.seed, num_ps=args.ps, log_every=50,
        checkpoint_dir=str(out / "ckpt"), summary_dir=str(out / "summaries"), save_summaries_steps=10)
    if args.in_process:  # one worker with the global batch: a sync step of N workers is this process's step
        return TrainConfig.flat(**common, batch_size=global_batch, num_workers=1)
    return TrainConfig.flat(**common, batch_size=args.batch_size, num_workers=args.workers, mode="sync",
                            replicas_to_aggregate=args.replicas_to_aggregate)


def evaluations(config: Any) -> dict[str, dict[str, float]]:
    """The final checkpoint evaluated on the held-out digits with its moving averages and with its variables
    (from the files, as the evaluator task reads them)."""
    from psflow.checkpoint.pointer import latest_checkpoint
    from psflow.data import read_all
    from psflow.export import load_checkpoint_model
    from psflow.train.build import data_options
    from psflow.train.evaluation import ArrayParameters, evaluate

    path = latest_checkpoint(config.checkpoint.dir)
    batch = read_all(list(config.data.eval), config.data.format, **data_options(config))
    out = {}
    for name, averages in (("averages", True), ("variables", False)):
        loaded = load_checkpoint_model(str(path), search_path=config.model.path, moving_averages=averages,
                                       model=config.model.name)  # our own module: named, so it may be imported
        out[name] = evaluate(loaded.model, ArrayParameters(loaded.values, what=str(path)), batch)
    return out


def learning_rates(summary_dir: str) -> list[tuple[int, float]]:
    """The ``learning_rate`` summary the chief wrote: (global step, rate) pairs."""
    from psflow.train.summary import read_scalars

    return list(read_scalars(summary_dir).get("learning_rate", []))


def main(argv: Sequence[str] | None = None) -> int:
    """Writes the digits, trains (distributed, or ``--in-process``), prints both evaluations; returns the exit status."""
    from psflow.launch.in_process import run_in_process
    from psflow.launch.local import run_local
    from psflow.train.config import ConfigError

    args = parse_args(argv)
    os.environ.setdefault("PSFLOW_TORCH_THREADS", "1")  # the processes share the machine's cores
    out = Path(args.output_dir or tempfile.mkdtemp(prefix="psflow-inception-distributed-"))
    data = cnn_digits().write_digits(out / "data", train_shards=max(1, args.workers))
    try:
        config = train_config(args, data, out)
    except ConfigError as e:
        print(f"inception_distributed: error: {e}", file=sys.stderr)
        return 1
    global_batch, decay_steps, max_steps = schedule(args, int(data["train_examples"]))
    shape = ("in one process" if args.in_process else
             f"{args.ps} ps + {args.workers} workers, sync: {args.replicas_to_aggregate} gradients per step, "
             f"{args.workers - args.replicas_to_aggregate} backup(s), batch {args.batch_size} each")
    print(f"inception_distributed: {shape}; global batch {global_batch}, {max_steps} steps ({args.epochs:g} epochs), "
          f"RMSProp at {args.learning_rate:g} x {args.decay_rate:g} every {decay_steps} steps, moving averages "
          f"{args.moving_average_decay:g}; run directory {out}", flush=True)
    started = time.monotonic()
    if args.in_process:
        metrics = run_in_process(config, str(out / "run"))
    else:
        metrics = run_local(config, str(out / "run"), progress=None if args.quiet else sys.stderr)
    both = evaluations(config)
    if not math.isclose(metrics["eval"]["accuracy"], both["averages"]["accuracy"], abs_tol=1e-12):
        print(f"inception_distributed: error: the run's evaluation with moving averages ({metrics['eval']}) differs "
              f"from its final checkpoint's ({both['averages']})", file=sys.stderr)
        return 1
    rates = learning_rates(config.report.summary_dir)
    avg, var = both["averages"], both["variables"]
    print(f"inception_distributed: accuracy {avg['accuracy']:.4f} with moving averages, {var['accuracy']:.4f} without; "
          f"log-loss {avg['logloss']:.4f} / {var['logloss']:.4f} on {avg['examples']} held-out digits", flush=True)
    first, last = (rates[0], rates[-1]) if rates else ((0, float("nan")), (0, float("nan")))
    print(f"inception_distributed: learning rate {first[1]:.5g} at step {first[0]} -> {last[1]:.5g} at step {last[0]} "
          f"(the chief's summary, {len(rates)} points); global_step {metrics['global_step']}, "
          f"{metrics['examples_per_sec']:.0f} examples/s, {time.monotonic() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
