#!/usr/bin/env bash
# Installs psflow in ./.venv and trains FTRL logistic regression on the bundled
# a9a data with a local cluster of 2 ps + 2 worker processes. Extra arguments
# go to `psflow train` (e.g. --workers 3 --partitions 4).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check -e . -c constraints.txt
exec .venv/bin/psflow train --train data/a9a/a9a --eval data/a9a/a9a.t --num-features 124 \
    --optimizer ftrl --ps 2 --workers 2 --epochs 3 --output runs/demo "$@"
