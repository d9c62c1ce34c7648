"""Fault injection for the local launcher: ``--chaos SPEC`` (repeatable): the schedule.

The grammar, the targets a spec may name and the checks made before anything starts are
:mod:`psflow.launch.chaos_plan`'s (:class:`~psflow.launch.chaos_plan.ChaosPlan`; import them from there); this module
fires a plan.

Schedule: faults fire in the order of their steps, in *rounds*: the faults
with the same ``N`` form one round and fire together; the next round waits
until every fault of this one has recovered (the launcher records that:
global_step advancing again after the task's replacement started, and a
restarted ps shard member back in its shard's view, see
:mod:`psflow.launch.fault_recovery`) and then keeps the spacing the specs give,
counted from the global_step seen at that recovery. So with rounds at steps
``N1 < N2 < ...``:

* round 1 fires at the first poll that sees ``global_step >= N1``;
* round k fires at the first poll, after every fault of round k-1 recovered,
  that sees ``global_step >= R + (Nk - N(k-1))``, where ``R`` is the largest
  ``recovered_at_step`` of round k-1.

A step jump does not collapse the schedule: killing ps task 0 makes
global_step jump past its durable bound (up to 1,000 values, see
:mod:`psflow.ps.global_step`), and without this rule every later ``@step=``
fault would fire at once. A fault whose task is not running when its round
fires (being restarted) fires as soon as the task is back; one whose task
exited 0 (its work done: never restarted) is dropped, not fired (``not fired:
/job:worker/task:1 (pid P) exited 0 ...``), so its round completes without it.
"Running" is the process's own state, not only the exit the watch loop recorded
(every 50 ms): no fault is sent to a process that already exited. A round that never
recovers (a task that is not restarted; a replicated shard's member whose
shard went on recovers with its promoted backup) holds every later fault back: they
are reported as ``faults_not_fired``. So are the faults still waiting when
every worker has finished its data (:meth:`ChaosInjector.training_ended`):
they are not fired (logged ``chaos: SPEC not fired: training ended at step
T`` and why: e.g. ``before kill:ps:0@step=100 (fired at global_step 102)
recovered: a round fires once the round before it recovered, then 200 steps
later``), since a fault after the end of training cannot be recovered by
rewinding the workers. At the run's end the launcher lists every fault of the
plan (:meth:`ChaosInjector.summary`, ``chaos: F of N faults fired``): fired,
with its recovery, or not fired, and why; a schedule that did less than it
was given never does so silently. (A replicated shard's killed primary
recovers only once its replacement rebuilt and rejoined the shard's view,
which takes the restart backoff and a process start: in a short run a second
``kill:ps:N`` round may be due only after training ended.)

The launcher reads global_step and fires a due round, or a fault of a begun
round whose target answers (:meth:`ChaosInjector.may_fire`), with every
training process held (SIGSTOP, for the moment of that reading and the
signals: :class:`psflow.launch.resilience.Resilience`), so no worker can end
between the reading that says training goes on and the fault: the run's
result never depends on that race. :meth:`ChaosInjector.poll` is called
every few ms (5 ms in the launcher), so a fault fires at its step or a little
later. Every fired fault is recorded (task, pid, signal, the step seen, wall
time, and the launcher adds when it recovered) for metrics.json.

One process, one fault at a time (:mod:`psflow.launch.chaos_plan` refuses two specs of one round naming
the same task before anything starts); a ``chief`` fault whose holder another fault of its round already
hit waits for the next holder.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from psflow.cluster import ClusterSpec
from psflow.cluster.replicas import BACKUP_JOB, ps_replicas
from psflow.launch.chaos_plan import ChaosPlan, DutyHolder, Fault
from psflow.launch.shard_targets import BACKUP_TARGET, SHARD_TARGETS, task_of

__all__ = ["InjectedFault", "ChaosInjector"]

log = logging.getLogger("psflow.launch")

@dataclass
class InjectedFault:
    """A fault that fired (recorded in metrics.json under ``faults``)."""

    spec: str
    task: str
    pid: int
    signal: str
    at_step: int
    time: float = field(default_factory=time.time)
    recovery_seconds: float | None = None   # fault -> global_step advancing again (set by the launcher)
    recovered_at_step: int | None = None
    lease_epoch: int | None = None           # a ``chief`` fault: the epoch of the lease its task held
    why: str | None = None                   # not recovered by the run's end: why (set by the launcher then)
    how: str | None = None                   # recovered otherwise than by a restart or restore (an idle ps task's
                                             # readmission: psflow.launch.fault_recovery.READMITTED)

    def to_json(self) -> dict[str, Any]:
        """Its fields, and ``recovered``: whether ``recovered_at_step`` is set."""
        return {**self.__dict__, "recovered": self.recovered_at_step is not None}


class ChaosInjector:
    """Fires a plan's faults round by round as global_step passes their steps (see the module
    docstring); not thread-safe: one thread polls, and records recoveries under the caller's lock."""

    def __init__(self, plan: ChaosPlan, cluster: ClusterSpec, find: Callable[[str, int], Any],
                 *, send: Callable[[int, int], None] | None = None,
                 holder: Callable[[], DutyHolder | None] | None = None, client: bool = False,
                 member: Callable[[str, int], str | None] | None = None,
                 ended: Callable[[str, int], str | None] | None = None) -> None:
        """Prepares the plan for ``cluster`` (with ``client``: and an in-graph client, see :meth:`ChaosPlan.resolve`).

        Args:
            plan: the faults.
            cluster: the cluster they target.
            find: (job, index) -> the task's current process object (with
                ``name``, ``pid`` and ``send_signal``) or ``None`` if it is not running.
            send: how to signal a pid (tests pass a fake); None (the launcher): through the process object's
                ``send_signal(sig)`` (:meth:`~psflow.launch.processes.TaskProcess.send_signal`: never a pid
                reaped since ``find`` returned it).
            holder: who holds the chief duties now (None: nobody at this moment); asked when
                a ``chief`` fault is due. Not given: ``chief`` is the configured chief.
            member: (replicated ps shards) ``(job, shard)`` -> the task a ``ps`` or ``ps-backup`` fault on
                that shard hits now (None: none now, the fault waits;
                :func:`psflow.launch.shard_targets.shard_target`). Not given: ``ps:N`` is ps task N and
                ``ps-backup:N`` ps_backup task N, the first in member order.
            ended: (job, index) -> why that task, not running, will not run again (it exited 0: its work done,
                never restarted), None while it runs or may be restarted. A fault of a round whose task ended is
                dropped, not fired (:attr:`not_fired` says why), so its round completes. Not given: never.

        Raises:
            ChaosError: a fault names a task that is not in the cluster, or two faults of one
                round name the same task.
        """
        resolved = plan.resolve(cluster, client=client)
        steps = sorted({f.step for f, _, _ in resolved})
        # Rounds in step order; inside a round, the order given.
        self._rounds = [[entry for entry in resolved if entry[0].step == step] for step in steps]
        self._find = find
        self._send = send
        self._holder = holder
        self._member = member if ps_replicas(cluster) > 0 else None
        self._ended = ended or (lambda job, index: None)
        self.injected: list[InjectedFault] = []
        self._begun = False                    # the first round has fired (some of) its faults
        self._last: list[InjectedFault] = []   # the faults fired by the last round begun
        self._last_step = 0                    # that round's step (N(k-1))
        self._begun_at = 0                     # the global_step that began the round firing now
        self._seen = 0                         # the newest global_step given to poll or training_ended
        self._specs = [fault.spec for fault, _, _ in resolved]  # the order given
        #: Faults dropped because training ended before their round fired (:meth:`training_ended`).
        self.skipped: list[str] = []
        #: Why each fault dropped (training ended, its task already gone) was not fired: spec -> one line.
        self.not_fired: dict[str, str] = {}

    def pending(self) -> int:
        """Faults not fired yet (and not dropped by :meth:`training_ended`)."""
        return sum(len(r) for r in self._rounds)

    def not_fired_count(self) -> int:
        """Faults of the plan not fired (yet): waiting, dropped at training's end, or their task already gone."""
        return len(self._specs) - len(self.injected)

    def summary(self) -> list[str]:
        """(The run's end) ``chaos: F of N faults fired``, then one line per fault in the order given: fired
        (signal, task, pid, global_step; recovered at which step, or why not) or not fired, and why."""
        fired = {f.spec: f for f in self.injected}
        waiting = {fault.spec: self._waiting(k) for k, round_ in enumerate(self._rounds) for fault, _, _ in round_}
        lines = [f"chaos: {len(fired)} of {len(self._specs)} faults fired"]
        for spec in self._specs:
            if spec in fired:
                f = fired[spec]
                how = f" ({f.how})" if f.how is not None else ""
                outcome = (f"recovered at global_step {f.recovered_at_step}{how}" if f.recovered_at_step is not None
                           else f"not recovered: {f.why}" if f.why is not None else "not recovered yet")
                lines.append(f"chaos:   {spec}: fired: {f.signal} to {f.task} (pid {f.pid}) at global_step "
                             f"{f.at_step}; {outcome}")
            elif spec in self.not_fired:
                lines.append(f"chaos:   {spec}: not fired: {self.not_fired[spec]}")
            else:
                lines.append(f"chaos:   {spec}: not fired by the run's end (global_step {self._seen} seen last): "
                             f"{waiting.get(spec, 'not reached')}")
        return lines

    def _waiting(self, k: int) -> str:
        """What round ``k`` of those left waits for (a clause of the run's end summary)."""
        if k > 0:
            return f"waiting for the round before it (step {self._rounds[k - 1][0][0].step}) to fire"
        if self._begun:
            return (f"its round came due at global_step {self._begun_at}; it waited for its target (a ps shard's "
                    "primary or backup, the chief duties' holder, or its task running again)")
        return self._held_back(self._seen, "waiting until")

    def _held_back(self, global_step: int, lead: str) -> str:
        """Why the next round, not begun, had not fired by ``global_step`` (a clause after ``lead``)."""
        step = self._rounds[0][0][0].step
        waiting = [f for f in self._last if f.recovered_at_step is None]
        if waiting:
            names = " and ".join(f"{f.spec} (fired at global_step {f.at_step})" for f in waiting)
            return (f"{lead} {names} recovered: a round fires once the round before it recovered, then "
                    f"{step - self._last_step} steps later")
        due = self.due_at()
        if due is not None and global_step >= due:
            return f"as its round came due (at global_step {due})"
        if not self._last:
            return f"{lead} its step"
        return (f"{lead} it was due at global_step {due} ({step - self._last_step} steps after the round before "
                f"it recovered, at global_step {max(f.recovered_at_step or 0 for f in self._last)})")

    def training_ended(self, global_step: int) -> list[str]:
        """Every worker finished its data (seen at ``global_step``): drops the faults of the rounds
        not begun, and returns their specs. Each is logged (``not fired: training ended at step T``)
        and counted in :attr:`skipped`.

        A fault fired then could not be recovered the way one during training is: the workers that
        finished leave, so a restore could not rewind them; the run's result would depend on whether
        the fault came a few milliseconds before or after the last worker's end. A round already begun
        (some of its faults fired) keeps firing its others: those are part of a recovery under way. A round
        that came due but none of whose faults found its target yet (a shard's failover under way, nobody
        holding the chief duties, its task being restarted) is not under way: it is dropped too, else it
        would fire once its target answered, during the final save or evaluation.
        """
        self._seen = max(self._seen, global_step)
        if self._begun and self._last:
            return []
        unfired = self._begun  # came due at self._begun_at, nothing of it fired
        self._begun = False
        dropped = []
        for k, round_ in enumerate(self._rounds):
            if k == 0 and unfired:
                why = (f"before any fault of its round found its target (the round came due at global_step "
                       f"{self._begun_at}; a ps shard's primary or backup, the chief duties' holder, or its task "
                       "running again, was waited for)")
            else:
                why = (self._held_back(global_step, "before") if k == 0
                       else f"before the round before it (step {self._rounds[k - 1][0][0].step}) fired")
            for fault, _, _ in round_:
                dropped.append(fault.spec)
                self.not_fired[fault.spec] = f"training ended at step {global_step} {why}"
                log.warning("chaos: %s not fired: %s", fault.spec, self.not_fired[fault.spec])
        self._rounds = []
        self.skipped += dropped
        return dropped

    def due_at(self) -> int | None:
        """The global_step at which the next round fires; None while a round is firing or the last one
        has not recovered yet, and when no fault is left. Reads ``recovered_at_step`` of the last
        round's faults (set by the launcher)."""
        if not self._rounds or self._begun:
            return None
        step = self._rounds[0][0][0].step
        if not self._last:  # the first round (or one whose every task was already gone): its own step
            return step
        recovered = [f.recovered_at_step for f in self._last]
        if any(r is None for r in recovered):
            return None
        return max(r for r in recovered if r is not None) + step - self._last_step

    def may_fire(self, global_step: int) -> bool:
        """Whether :meth:`poll` at ``global_step`` may fire a fault now (the launcher holds the trainers for that
        poll only): the next round comes due, or a begun round has a fault whose target answers and runs (asked
        now, unheld: the held poll asks again). ``global_step`` counts as seen (the run's end summary)."""
        self._seen = max(self._seen, global_step)
        if not self._rounds:
            return False
        if not self._begun:
            due = self.due_at()
            return due is not None and global_step >= due
        targets, unresolved = self._targets(self._rounds[0])
        return not (unresolved and not self._last) and any(
            self._find(job, i) is not None or self._ended(job, i) is not None for _, job, i, _ in targets)

    def poll(self, global_step: int) -> list[InjectedFault]:
        """Fires the faults of the next round whose task is running, once the round is due (see the
        module docstring); a fault of a begun round whose task is not running fires when it is back.

        Returns:
            The faults fired by this call, in the order given.
        """
        self._seen = max(self._seen, global_step)
        if not self._rounds:
            return []
        if not self._begun:
            due = self.due_at()
            if due is None or global_step < due:
                return []
            self._begun, self._last, self._last_step = True, [], self._rounds[0][0][0].step
            self._begun_at = global_step
        head = self._rounds[0]
        fired = []
        targets, unresolved = self._targets(head)
        if unresolved and not self._last:
            return []  # nothing of this round fired yet and a shard fault has no target now: fire them together
        for entry, job, index, epoch in targets:
            fault = entry[0]
            task = self._find(job, index)
            if task is None and (why := self._ended(job, index)) is not None:
                head.remove(entry)  # it will not come back: dropped, so the round completes without it
                self.not_fired[fault.spec] = f"{why}, before its round fired at global_step {global_step}"
                log.warning("chaos: %s not fired: %s", fault.spec, self.not_fired[fault.spec])
                continue
            if task is None:
                continue  # not running now (e.g. being restarted): fire when it is back
            head.remove(entry)
            try:
                if self._send is None:
                    task.send_signal(fault.signal)
                else:
                    self._send(task.pid, fault.signal)
            except ProcessLookupError:
                log.warning("chaos: %s: %s (pid %d) already gone", fault.spec, task.name, task.pid)
                self.not_fired[fault.spec] = f"{task.name} (pid {task.pid}) was already gone at global_step {global_step}"
                continue
            event = InjectedFault(fault.spec, task.name, task.pid, fault.signal.name, global_step, lease_epoch=epoch)
            log.warning("chaos: %s: sent %s to %s (pid %d) at global_step %d%s",
                        fault.spec, event.signal, task.name, task.pid, global_step,
                        f" (the chief duties' holder, lease epoch {epoch})" if epoch is not None else "")
            self.injected.append(event)
            self._last.append(event)
            fired.append(event)
        if not head:
            self._rounds.pop(0)
            self._begun = False
        return fired

    def _targets(self, head: list[tuple[Fault, str, int]]
                 ) -> tuple[list[tuple[tuple[Fault, str, int], str, int, int | None]], bool]:
        """Each fault of the round ``head`` with the (job, index) it hits now and the lease epoch it saw (a
        ``chief`` fault), every one read BEFORE any of them is signalled: a round that kills a shard's primary and
        its backup reads both from the members' statuses while the primary still answers (once it is killed, no
        member says primary and the backup would have no target). A ``chief`` or shard fault with no target now
        (nobody holds the duties, a failover under way, or a target another fault of this round has) is left for
        the next poll; a fault naming a task hits that task. Also returns whether a shard fault found no member
        to hit (:meth:`poll` then fires none of a round not begun: all its statuses are read again first)."""
        taken = {f.task for f in self._last}
        out = []
        unresolved = False
        for entry in head:
            fault, job, index = entry
            epoch, dynamic = None, True
            if fault.job is None and self._holder is not None:  # the chief: whoever holds the duties now
                holder = self._holder()
                if holder is None:
                    continue  # nobody holds them now: wait for one
                job, index, epoch = holder.job, holder.index, holder.epoch
            elif job in SHARD_TARGETS and self._member is not None:  # the shard's primary or backup now
                target = self._member(job, index)
                if target is None:
                    unresolved = True
                    continue  # a failover under way, or a member slow to answer: ask again at the next poll
                job, index = task_of(target)
            else:
                job, dynamic = BACKUP_JOB if job == BACKUP_TARGET else job, False
            name = f"/job:{job}/task:{index}"
            if dynamic and name in taken:
                continue  # this round hit (or is about to hit) that process already: wait for another target
            taken.add(name)
            out.append((entry, job, index, epoch))
        return out, unresolved
