"""The in-graph client readmits an idle ps task (one holding nothing: psflow.train.idle_tasks) restarted empty, as a
between-graph lease holder does, unfenced: it is the run's only chief and holds no lease.

Seen (review R_A2 of 7870699): ``psflow train --replication in-graph --ps 4 --workers 2 --model logistic
--restart-policy on-failure --chaos kill:ps:3@step=30``: ReadmitIdleTasks was made only with a leadership, which an
in-graph client has none of, so ps task 3 stayed not ready to the run's end; the launcher said 'it lost nothing and
was made ready again' (it was not), 'lost its state after training', and the chaos summary 'not recovered'. Before
12ab6bf every save failed on it meanwhile, the client failed at --max-failed-saves and its restart restored every
ps task from the newest checkpoint.

Real in-process ps services, the layout of test_idle_ps_task_restarted.py (nothing on ps tasks 2 and 3).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_idle_ps_task_restarted import _restart, _trained
from two_ps_in_process import SGD

from psflow.train.idle_tasks import ReadmitIdleTasks

pytestmark = pytest.mark.timeout(60)


def test_the_only_chief_readmits_unfenced(tmp_path: Path) -> None:
    services, client, trained = _trained(tmp_path)
    hook = ReadmitIdleTasks(client, SGD, None, run="run-a")  # no lease: the in-graph client
    assert hook.check() is True  # nothing restarted
    _restart(client, services, 3)
    assert client.ps_stats(3).ready is False
    assert hook.check() is True
    assert [(s.ready, s.generation) for s in (client.ps_stats(t) for t in range(4))] == [(True, 0)] * 4
    assert client.ps_stats().global_step == 3
    np.testing.assert_array_equal(client.pull({"weights": None})["weights"], trained["weights"])
