"""Writes data/criteo_synthetic/: SYNTHETIC click logs in the Criteo TSV layout (no real data in it).

    python scripts/make_synthetic_criteo.py            # the committed files, byte for byte
    python scripts/make_synthetic_criteo.py --output DIR --train-rows 100000 --eval-rows 20000 --seed 7

The real Criteo samples may not be bundled (their terms: CC BY-NC-SA, non-commercial), so a fresh clone
gets this instead: the layout of Criteo's display-advertising logs, with values drawn here.

* **Layout**: one row per line, tab-separated, no header: ``<label> <I1>..<I13> <C1>..<C26>``; the label 0
  or 1; I1..I13 integer counts (mostly small, a long tail; ``I2`` is sometimes -1 or -2 and ``I8``
  sometimes -1, as in the real files); C1..C26 categorical values written as 8 lower-case hex characters;
  a missing value is an empty field (some columns often, most rarely).
* **Values**: each categorical column has its own vocabulary (3 to 3,000 values, the sizes of the real
  sample's columns) drawn with Zipf-like frequencies, so frequent values recur and rare ones appear once;
  a value's hex string is a hash of (seed, column, value), so it is the same in both files.
* **Labels**: from a hidden logistic model: a weight per value of 8 of the categorical columns, per
  of 4 of the counts (on ``log1p``), and a bias set so that about 4.5% of the rows are positive (real
  click-through data is similarly imbalanced). The hidden model itself scores eval AUC 0.92; ``psflow
  train --model logistic`` (3 epochs, batch 128) learns 0.84 from train.txt; the bias alone, 0.5.

Deterministic: only ``random.Random(seed).random()`` (whose sequence Python keeps across versions),
BLAKE2 hashes and ``math`` are used, so the same arguments give the same bytes
(tests/unit/data/test_criteo_synthetic.py regenerates the committed files and compares them).
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import math
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUTPUT = os.path.join(os.path.dirname(HERE), "data", "criteo_synthetic")
SEED, TRAIN_ROWS, EVAL_ROWS = 20240, 3000, 800
POSITIVE_RATE = 0.045

#: Distinct values per categorical column (the real 10k-row sample's counts).
VOCABULARY = [2755, 1796, 2704, 724, 1452, 3, 1934, 518, 20, 2550, 1451, 3019, 9, 355, 1127, 29, 3, 166, 12, 2799,
              2088, 2692, 1260, 2136, 29, 24]
#: How often each categorical column is empty.
CAT_MISSING = [0.0, 0.0, 0.03, 0.03, 0.0, 0.12, 0.0, 0.0, 0.0, 0.0, 0.0, 0.03, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.44,
               0.44, 0.03, 0.76, 0.0, 0.03, 0.44, 0.44]
#: How often each count is empty, and the mean of its log (a log-normal count).
INT_MISSING = [0.45, 0.0, 0.2, 0.22, 0.03, 0.23, 0.04, 0.0, 0.04, 0.45, 0.04, 0.77, 0.22]
INT_LOG_MEAN = [0.7, 2.0, 1.8, 1.5, 7.5, 3.5, 1.5, 2.2, 3.5, 0.4, 0.9, 0.5, 1.6]
#: The hidden model: categorical columns whose values carry a weight, and their spread; counts with a weight.
CAT_WEIGHT_SCALE = {5: 1.35, 8: 1.35, 12: 1.2, 15: 1.2, 16: 1.05, 18: 1.05, 1: 1.8, 13: 1.5}
INT_WEIGHTS = {0: 0.7, 2: -0.5, 6: 0.6, 10: 0.8}
ZIPF = 1.1


def _digest(*parts: object) -> bytes:
    return hashlib.blake2b(":".join(str(p) for p in parts).encode(), digest_size=8).digest()


def _unit(*parts: object) -> float:
    """A number in [0, 1) fixed by ``parts``."""
    return int.from_bytes(_digest(*parts), "big") / 2**64


def _hex(seed: int, column: int, value: int) -> str:
    return _digest("value", seed, column, value)[:4].hex()


def _normal(rnd: random.Random) -> float:
    """A standard normal draw (Box-Muller) from two ``random()`` calls."""
    u1, u2 = rnd.random(), rnd.random()
    return math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(2.0 * math.pi * u2)


def _cumulative(size: int) -> list[float]:
    total, out = 0.0, []
    for rank in range(1, size + 1):
        total += rank ** -ZIPF
        out.append(total)
    return [c / total for c in out]


def _weight(seed: int, column: int, value: int, scale: float) -> float:
    """The hidden model's weight of a categorical value: a third of the values carry none."""
    u = _unit("weight", seed, column, value)
    return 0.0 if u < 1 / 3 else scale * (3.0 * u - 2.0) * 1.5


def generate(rows: int, seed: int) -> tuple[list[list[str]], list[float]]:
    """``rows`` rows' 39 feature fields and their logits without the bias."""
    rnd = random.Random(seed)
    cumulative = [_cumulative(size) for size in VOCABULARY]
    fields, logits = [], []
    for _ in range(rows):
        row, logit = [], 0.0
        for k in range(13):
            if rnd.random() < INT_MISSING[k]:
                row.append("")
                continue
            value = int(math.exp(INT_LOG_MEAN[k] + 1.2 * _normal(rnd)))
            if k == 1 and rnd.random() < 0.06:
                value = -1 - int(rnd.random() * 2)  # I2 holds -1 and -2
            elif k == 7 and rnd.random() < 0.01:
                value = -1
            row.append(str(value))
            logit += INT_WEIGHTS.get(k, 0.0) * (math.log1p(max(value, 0)) - INT_LOG_MEAN[k])
        for j, size in enumerate(VOCABULARY):
            draw = rnd.random()
            if rnd.random() < CAT_MISSING[j]:
                row.append("")
                continue
            value = min(bisect.bisect_left(cumulative[j], draw), size - 1)
            row.append(_hex(seed, j, value))
            if j in CAT_WEIGHT_SCALE:
                logit += _weight(seed, j, value, CAT_WEIGHT_SCALE[j])
        fields.append(row)
        logits.append(logit)
    return fields, logits


def _bias(logits: list[float], rate: float) -> float:
    """The bias that makes the mean click probability ``rate`` (bisection)."""
    lo, hi = -30.0, 30.0
    for _ in range(100):
        mid = (lo + hi) / 2
        mean = sum(1 / (1 + math.exp(-(z + mid))) for z in logits) / len(logits)
        lo, hi = (mid, hi) if mean < rate else (lo, mid)
    return (lo + hi) / 2


def write(output: str, train_rows: int, eval_rows: int, seed: int) -> list[str]:
    """Writes ``train.txt`` and ``eval.txt`` (rows drawn in one sequence, split in that order) into ``output``."""
    fields, logits = generate(train_rows + eval_rows, seed)
    bias = _bias(logits, POSITIVE_RATE)
    rnd = random.Random(seed + 1)
    lines = []
    for row, logit in zip(fields, logits, strict=True):
        label = int(rnd.random() < 1 / (1 + math.exp(-(logit + bias))))
        lines.append("\t".join([str(label), *row]) + "\n")
    os.makedirs(output, exist_ok=True)
    paths = []
    for name, part in (("train.txt", lines[:train_rows]), ("eval.txt", lines[train_rows:])):
        path = os.path.join(output, name)
        with open(path, "w", encoding="ascii", newline="\n") as f:
            f.writelines(part)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", default=DEFAULT_OUTPUT, help="directory for train.txt and eval.txt (%(default)s)")
    p.add_argument("--train-rows", type=int, default=TRAIN_ROWS, help="%(default)s")
    p.add_argument("--eval-rows", type=int, default=EVAL_ROWS, help="%(default)s")
    p.add_argument("--seed", type=int, default=SEED, help="%(default)s")
    args = p.parse_args(argv)
    if args.train_rows < 1 or args.eval_rows < 1:
        p.error("--train-rows and --eval-rows must be >= 1")
    for path in write(args.output, args.train_rows, args.eval_rows, args.seed):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
