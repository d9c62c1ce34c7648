#!/usr/bin/env bash
# Installs psflow with its test dependencies in ./.venv and runs the whole
# test suite (unit + integration with real processes). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian packages some tests need: ZooKeeper (coordination backends) and Chromium (the status page,
# driven headless). Those tests skip when a package is missing, so a failed install (not root, no apt,
# no network) must not fail the run.
missing=()
[ -e /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
command -v chromium >/dev/null || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    { timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq "${missing[@]}"; } \
        </dev/null >/dev/null 2>&1 || echo "scripts/test.sh: not installed: ${missing[*]}; their tests will be skipped" >&2
fi
python3 -m venv .venv
# Every extra (all: plots, tensorboard, zookeeper, torch, cloud; test: the S3 and GCS emulators), so no test
# skips for a missing one.
# torch==2.13.0+cpu (constraints.txt) is PyTorch's CPU build: from PyTorch's CPU index where pip's own
# configuration does not already find it (a local wheel directory, a mirror).
.venv/bin/pip install --quiet --disable-pip-version-check -e '.[test,all,examples]' -c constraints.txt \
    || .venv/bin/pip install --quiet --disable-pip-version-check -e '.[test,all,examples]' -c constraints.txt \
        --extra-index-url https://download.pytorch.org/whl/cpu
# The C kernels (psflow/data/_native.c: input; psflow/native/_ids.c: ids; psflow/ps/_kernels.c: optimizer
# updates; psflow/torch/_lookup.c: embedding gathers; psflow/models/_logistic.c: the logistic model's
# per-entry loops) are optional for users, but where they can be built (a C compiler and Python's headers) the
# install must have built them: the tests then fail instead of skipping their C side.
if { command -v cc >/dev/null || command -v gcc >/dev/null; } && .venv/bin/python -c \
    "import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"; then
    export PSFLOW_REQUIRE_NATIVE=1
fi
.venv/bin/ruff check psflow tests benchmarks examples
.venv/bin/mypy --strict psflow
# The layers (pyproject.toml's [tool.importlinter]): no module imports a package above its own.
.venv/bin/lint-imports
# The 25 slowest tests close the log: where the suite's time goes (keep the whole run near 10 minutes);
# -rfEs: the summary names each failure, error and skip (with its reason: a skip on CI is a question).
exec .venv/bin/python -m pytest -q -rfEs --durations=25 "$@"
