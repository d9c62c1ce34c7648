"""A TFJob's ``chief`` task trains too: the training workers are [chief 0, worker 0, ...]."""

from __future__ import annotations

import pytest

from psflow.cluster import ClusterError, ClusterSpec
from psflow.train.chief import is_chief, training_view

TFJOB = ClusterSpec({"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "ps": ["p0:1"]})


def test_a_chief_job_trains_as_the_first_worker() -> None:
    view, index = training_view(TFJOB, "chief", 0)
    assert view.job_tasks("worker") == ("c:1", "w0:1", "w1:1") and view.job_tasks("ps") == ("p0:1",)
    assert "chief" not in view.jobs and index == 0 and is_chief(view, "worker", index)
    assert [training_view(TFJOB, "worker", i)[1] for i in range(2)] == [1, 2]
    assert not is_chief(view, "worker", 1)


def test_without_a_chief_job_nothing_changes() -> None:
    cluster = ClusterSpec({"worker": ["w0:1", "w1:1"], "ps": ["p0:1"]})
    assert training_view(cluster, "worker", 1) == (cluster, 1)
    only_chief = ClusterSpec({"chief": ["c:1"], "ps": ["p0:1"]})
    assert training_view(only_chief, "chief", 0)[0].job_tasks("worker") == ("c:1",)


def test_tasks_that_do_not_train_are_refused() -> None:
    with pytest.raises(ClusterError, match="does not train"):
        training_view(TFJOB, "ps", 0)
