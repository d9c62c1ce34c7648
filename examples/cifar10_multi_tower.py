"""TensorFlow's multi-GPU CIFAR-10 trainer on psflow: a tower per device inside one worker.

TensorFlow's ``cifar10_multi_gpu_train.py`` keeps the variables on the CPU,
builds one replica of the model -- a *tower* -- on each GPU, gives each tower
a batch of its own (``--batch_size`` examples each), averages the towers'
gradients and applies them once per step with gradient descent. psflow does the
same inside a worker process (``psflow train --towers N``, ``--device cuda``,
``--devices cuda:0,cuda:1``; :mod:`psflow.torch.towers`), with ``--batch-size``
the worker's whole batch (TF's ``num_gpus * batch_size``): the variables live on
the ps tasks and are pulled once per step, copied to every tower, the batch is cut
into one slice per tower, the towers run at once (CPU towers in threads), and
their gradients -- each slice's weighted by its share of the batch, so N
towers on a batch push exactly what one model on it pushes -- are summed on
the worker and pushed once. The model is the CNN of ``examples/cnn_digits.py``
(:class:`DigitsCNN`, wider with ``--channels``/``--hidden``) on scikit-learn's
bundled 8x8 digits (nothing is downloaded).

Run with no arguments, it trains a small local demo -- its own processes on
127.0.0.1 (1 ps task, 1 worker with 2 CPU towers), started by psflow's
launcher (:func:`psflow.launch.local.run_local`) -- and prints the accuracy on
the 360 held-out digits (about 0.97)::

    python examples/cifar10_multi_tower.py
    python examples/cifar10_multi_tower.py --device cuda --towers 2 --epochs 20   # 2 towers on one GPU
    python examples/cifar10_multi_tower.py --devices cuda:0,cuda:1 --batch-size 256 --channels 32,64 --hidden 128
    python examples/cifar10_multi_tower.py --workers 2 --mode sync --towers 2      # towers in each of 2 workers

The same run from the command line: ``python -m examples.cnn_digits`` writes
the data, then ``psflow train --model examples.cnn_digits:DigitsCNN ...
--towers 2`` (see ``docs/torch.md``).
"""

from __future__ import annotations

import argparse
import importlib
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


def cnn_digits() -> ModuleType:
    """``examples/cnn_digits.py`` (the model and the data), however this script is started."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("examples.cnn_digits")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="cifar10_multi_tower", description=__doc__.splitlines()[0])
    p.add_argument("--towers", type=int, default=2, help="towers (model replicas) in each worker, each on --device (2)")
    p.add_argument("--device", default="cpu", help="where the towers compute: cpu, cuda or cuda:N (cpu)")
    p.add_argument("--devices", help="a tower on each device, e.g. cuda:0,cuda:1 (instead of --device and --towers)")
    p.add_argument("--epochs", type=int, default=10, help="passes over the 1,437 training digits (10)")
    p.add_argument("--batch-size", type=int, default=64, help="examples per worker and step, split over its towers (64)")
    p.add_argument("--learning-rate", type=float, default=0.2, help="gradient descent's learning rate (0.2)")
    p.add_argument("--clip-gradient-norm", type=float, help="clip each step's gradients to this global norm (none)")
    p.add_argument("--channels", default="8,16", help="output channels of the two convolutions (8,16)")
    p.add_argument("--hidden", type=int, default=32, help="units of the hidden dense layer (32)")
    p.add_argument("--ps", type=int, default=1, help="ps tasks (1)")
    p.add_argument("--workers", type=int, default=1, help="worker processes, each with its towers (1)")
    p.add_argument("--mode", default="async", choices=["async", "sync"], help="with several workers: sync averages "
                   "the workers' gradients too, as SyncReplicasOptimizer (async)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model's initial values (0)")
    p.add_argument("--output-dir", help="where the data, logs and metrics go (default: a new temporary directory)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def train_config(args: argparse.Namespace, data: dict[str, Any]) -> Any:
    """The run's :class:`~psflow.train.config.TrainConfig` (what ``psflow train`` builds from its flags)."""
    from psflow.train.config import TrainConfig

    channels = [int(c) for c in args.channels.split(",")]
    return TrainConfig.flat(
        train=tuple(data["train"]), eval=(data["test"],), format="tfrecord", schema=data["schema"],
        model=MODEL, model_path=str(ROOT), model_params={"channels": channels, "hidden": args.hidden},
        optimizer="sgd", learning_rate=args.learning_rate, clip_gradient_norm=args.clip_gradient_norm,
        batch_size=args.batch_size, epochs=args.epochs, seed=args.seed, num_ps=args.ps, num_workers=args.workers,
        mode=args.mode, log_every=50, device=args.device if not args.devices else "cpu",
        towers=args.towers if not args.devices else 1,
        devices=tuple(d.strip() for d in args.devices.split(",")) if args.devices else ())


def main(argv: Sequence[str] | None = None) -> int:
    """Writes the digits, trains on a local cluster, prints the held-out accuracy; returns the exit status."""
    from psflow.launch.local import run_local
    from psflow.models import ModelError, create_model
    from psflow.train.build import model_config
    from psflow.train.config import ConfigError

    args = parse_args(argv)
    out = Path(args.output_dir or tempfile.mkdtemp(prefix="psflow-cifar10-multi-tower-"))
    data = cnn_digits().write_digits(out / "data", train_shards=max(1, args.workers))
    flag = f"--devices {args.devices}" if args.devices else f"--device {args.device}"
    try:  # the settings and devices, checked before anything starts ("PyTorch sees no GPU (...)" where it sees none)
        config = train_config(args, data)
        towers = config.compute_devices()
        create_model(config.model.name, model_config(config), search_path=config.model.path).place(towers)
    except ModelError as e:
        print(f"cifar10_multi_tower: error: {flag}: {e}", file=sys.stderr)
        return 1
    except ConfigError as e:
        print(f"cifar10_multi_tower: error: {e}", file=sys.stderr)
        return 1
    print(f"cifar10_multi_tower: {args.ps} ps + {args.workers} worker(s), {len(towers)} towers each ({', '.join(towers)}), "
          f"batch {args.batch_size} per worker, {args.epochs} epochs; run directory {out / 'run'}", flush=True)
    started = time.monotonic()
    metrics = run_local(config, str(out / "run"), progress=None if args.quiet else sys.stderr)
    ev = metrics["eval"]
    print(f"cifar10_multi_tower: accuracy {ev['accuracy']:.4f}, log-loss {ev['logloss']:.4f} on {ev['examples']} "
          f"held-out digits; global_step {metrics['global_step']}, {metrics['examples']} examples, "
          f"{metrics['examples_per_sec']:.0f} examples/s, {time.monotonic() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
