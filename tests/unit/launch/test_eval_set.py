"""The launcher's eval set, read on a thread while the tasks train (psflow.launch.eval_set)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support import A9A_T

from psflow.data import DataError
from psflow.launch.eval_set import EvalSet
from psflow.train.config import TrainConfig
from psflow.train.worker import load_eval

pytestmark = pytest.mark.timeout(60)


def test_the_batch_is_load_evals_own() -> None:
    config = TrainConfig.flat(train=(str(A9A_T),), eval=(str(A9A_T),), format="libsvm", num_features=124)
    got, want = EvalSet(config).result(), load_eval(config)
    assert got is not None and want is not None and len(got.labels) == len(want.labels) == 16281
    np.testing.assert_array_equal(got.labels, want.labels)
    for name, column in want.sparse.items():
        np.testing.assert_array_equal(got.sparse[name].ids, column.ids)
        np.testing.assert_array_equal(got.sparse[name].values, column.values)
        np.testing.assert_array_equal(got.sparse[name].indptr, column.indptr)


def test_no_eval_set_is_none() -> None:
    assert EvalSet(TrainConfig.flat(train=(str(A9A_T),), format="libsvm")).result() is None


def test_a_malformed_eval_file_is_raised_where_the_launcher_evaluates(tmp_path: Path) -> None:
    bad = tmp_path / "eval.libsvm"
    bad.write_text("1 3:1 7:1\n0 5:oops\n")
    eval_set = EvalSet(TrainConfig.flat(train=(str(A9A_T),), eval=(str(bad),), format="libsvm", num_features=124))
    with pytest.raises(DataError, match="eval.libsvm"):
        eval_set.result()
