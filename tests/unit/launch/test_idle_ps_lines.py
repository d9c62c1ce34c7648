"""The launcher's lines about ps tasks that hold none of the model's variables (psflow.launch.idle_ps): at the
start, which tasks the placement leaves idle; at the end, which of them were restarted, and that nothing was
restored for them (where no restore within the run happened)."""

from __future__ import annotations

from psflow.cluster import ClusterSpec
from psflow.launch.idle_ps import idle_line, readmitted_lines
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient


def _client(num_ps: int) -> ParameterClient:
    cluster = ClusterSpec({"ps": [f"127.0.0.1:{i + 1}" for i in range(num_ps)]})
    vs = VariableSet(replica_device_setter(cluster=cluster))
    vs.get_variable("weights", (8, 2))
    vs.get_variable("bias", (2,))
    return ParameterClient(cluster, vs.placements(), client_name="launcher")


def test_the_start_names_the_idle_tasks() -> None:
    assert idle_line(_client(4), sync=False) == (
        "psflow: --ps 4 for 2 variable(s): /job:ps/task:2, /job:ps/task:3 hold none of them (idle: fewer ps tasks "
        "would do; one restarted comes back without a restore)")
    assert idle_line(_client(2), sync=False) is None
    assert idle_line(_client(4), sync=True) is None  # every task takes part in each sync step


def test_the_end_names_the_idle_tasks_restarted() -> None:
    events = [{"task": "/job:ps/task:3", "restarted": True}, {"task": "/job:ps/task:3", "restarted": True},
              {"task": "/job:ps/task:1", "restarted": True}, {"task": "/job:ps/task:2", "restarted": False}]
    ready = [{"task": f"/job:ps/task:{i}", "ready": True} for i in range(4)]
    assert readmitted_lines(_client(4), events, sync=False, restored=False, ps_stats=ready) == [
        "psflow: /job:ps/task:3 restarted 2 times holding no variables: it lost nothing and was made ready again; "
        "nothing was restored"]
    assert readmitted_lines(_client(4), events[:1], sync=False, restored=True, ps_stats=ready) == [  # another
        # task's loss restored
        "psflow: /job:ps/task:3 restarted 1 time holding no variables: it lost nothing and was made ready again"]
    assert readmitted_lines(_client(4), events, sync=True, restored=False, ps_stats=ready) == []


def test_an_idle_task_restarted_and_not_ready_at_the_end_is_not_said_made_ready() -> None:
    """(R_A2's note) The end said 'made ready again' of every idle task restarted: an in-graph run whose client
    never readmitted it said so beside a task not ready."""
    events = [{"task": "/job:ps/task:3", "restarted": True}]
    down = [*({"task": f"/job:ps/task:{i}", "ready": True} for i in range(3)),
            {"task": "/job:ps/task:3", "ready": False, "error": "unavailable"}]
    assert readmitted_lines(_client(4), events, sync=False, restored=False, ps_stats=down) == [
        "psflow: /job:ps/task:3 restarted 1 time holding no variables: it lost nothing (not ready again by the run's "
        "end: the model is whole without it); nothing was restored"]
