"""A member rebuilding from the primary (Join) enters the view within a bounded time even while two
threads push without pause (issue 28): once it is a few entries behind, new entries wait until it acked the
newest (psflow/ps/replication/forwarder.py's hold); it then holds the primary's state bit for bit."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from replica_shard import PRIMARY, WORKERS, InProcessShard, assert_same_state, backup, layout

from psflow.ps.protocol import JoinRequest, PushRequest, ReplicateRequest, WorkerTag
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import FailedPreconditionError

pytestmark = pytest.mark.timeout(60)


def _push(worker: str, push_id: int) -> PushRequest:
    rows = np.array([push_id % 20], np.int64)
    return PushRequest([("w/part_0", np.full((1, 4), 0.01, np.float32), rows),
                        ("b/part_0", np.full(4, 0.01, np.float32), None)],
                       WorkerTag(worker, 1, push_id=push_id, acked=push_id - 1), step=True, examples=1)


def test_a_joining_member_enters_the_view_under_continuous_pushes(make_shard: Callable[..., InProcessShard]) -> None:
    shard = make_shard(backups=2)
    shard.start()
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    # Round trips: the joining member's are longer (another host, a busier one): entries queue up while each
    # of its calls is out, so it is always some entries behind the newest
    shard.latency.update({backup(0): 0.002, backup(1): 0.02})
    stop, pushed, errors = threading.Event(), [0, 0], []

    def pusher(n: int) -> None:
        push_id = 0
        while not stop.is_set():
            push_id += 1
            try:
                shard.push(PRIMARY, _push(WORKERS[n], push_id))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
                return
            pushed[n] += 1
    threads = [threading.Thread(target=pusher, args=(n,), daemon=True) for n in (0, 1)]
    for t in threads:
        t.start()
    try:
        shard.wait(lambda: min(pushed) > 50, "pushes under way")
        joining = backup(1)
        shard.add(joining)  # a restarted process of the backup: empty, it rebuilds by Join
        shard.start(joining)
        began = time.monotonic()
        shard.wait(lambda: joining in shard.replicas[PRIMARY].view.view.backups and shard.replicas[joining].has_state,
                   f"{joining} back in the view", limit=10.0)
        entered = time.monotonic() - began
        before = list(pushed)
        shard.wait(lambda: min(p - b for p, b in zip(pushed, before, strict=True)) > 20, "pushes go on after it entered")
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert not errors, errors
    assert entered < 5.0, entered
    print(f"entered the view {entered:.2f} s after its restart")
    assert_same_state(shard.services[PRIMARY], shard.services[joining])
    global_step = shard.services[PRIMARY].global_step
    assert global_step is not None and global_step.value == sum(pushed)


def _rejoin_setup(make_shard: Callable[..., InProcessShard]) -> InProcessShard:
    shard = make_shard(backups=1)
    shard.start()
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    for push_id in range(1, 4):
        shard.push(PRIMARY, _push(WORKERS[0], push_id))
    return shard


def test_a_call_meant_for_a_members_earlier_process_never_takes_the_restarted_one_out_of_the_view(
        make_shard: Callable[..., InProcessShard]) -> None:
    """The primary's sender to a member's earlier process (which was joining: its calls say 'not in the view')
    had a call out when the member restarted again; held up in the network, that call reaches the new process
    after it entered the view. It is refused: the member stays a backup with state (it used to turn the member
    back to 'joining' while the primary waited for it as a backup: the cause of the restarted-mid-snapshot bug,
    tests/unit/ps/replication/test_full_entry_chunks.py)."""
    shard = _rejoin_setup(make_shard)
    member, late = backup(0), threading.Event()
    shard.held_requests[(member, ReplicateRequest.METHOD)] = late
    shard.add(member)  # process 2: the primary's first call to it (its snapshot) is held up
    shard.start(member)
    shard.wait(lambda: shard.holding == 1, "the call with process 2's snapshot held up")
    del shard.held_requests[(member, ReplicateRequest.METHOD)]
    shard.add(member)  # process 3, before process 2 got anything
    shard.start(member)
    shard.wait_view()
    late.set()
    shard.wait(lambda: shard.holding == 0, "the held call served by process 3")
    replica = shard.replicas[member]
    assert replica.has_state and replica.view.view.role == "backup", replica.view.view
    shard.push(PRIMARY, _push(WORKERS[0], 4))
    assert_same_state(shard.services[PRIMARY], shard.services[member])


def test_a_member_whose_join_reply_comes_after_its_snapshot_stays_in_the_view(
        make_shard: Callable[..., InProcessShard], caplog: pytest.LogCaptureFixture) -> None:
    """A restarted member's Join is served at once (the primary starts its sender) but the reply is held up; the
    snapshot and the entry that puts it in the view arrive first. Reading the reply then must not set the
    member back to 'joining' while the primary counts it as a backup (in a quiet shard no entry would ever
    correct it)."""
    shard = _rejoin_setup(make_shard)
    member, late = backup(0), threading.Event()
    shard.held_replies[(PRIMARY, JoinRequest.METHOD)] = late
    shard.add(member)
    with caplog.at_level(logging.INFO, logger="psflow.ps.replication"):
        shard.start(member)
        shard.wait_view()  # in the view, its Join's reply still held up
        late.set()
        shard.wait(lambda: any(f"{member}: rebuilding shard 0 from {PRIMARY}" in r.getMessage()
                               for r in caplog.records), "the member read its Join's reply")
    replica = shard.replicas[member]
    assert replica.has_state and replica.view.view.role == "backup", replica.view.view
    assert_same_state(shard.services[PRIMARY], shard.services[member])


def test_a_join_served_after_its_caller_gave_up_never_takes_the_member_out_of_the_view(
        make_shard: Callable[..., InProcessShard]) -> None:
    """A restarted member's Join is served (the primary starts a sender, whose first call, the snapshot, is
    held up in the network) but its reply is lost: the member's call times out and it sends another Join, from
    the same process. The second Join's sender replaces the first, and the member enters the view. The first
    sender's held call, then served, carries the view it was built with ('not in the view') and the same
    incarnation: it is refused by its Join's id (it used to set the member back to 'joining' for good while
    the primary counted it as a backup)."""
    shard = _rejoin_setup(make_shard)
    member, late = backup(0), threading.Event()
    shard.held_requests[(member, ReplicateRequest.METHOD)] = late
    shard.lost_replies[(PRIMARY, JoinRequest.METHOD)] = 1
    shard.add(member)
    shard.start(member)
    shard.wait(lambda: shard.holding == 1, "the first Join's snapshot held up")
    del shard.held_requests[(member, ReplicateRequest.METHOD)]
    shard.wait_view()  # the second Join's sender brought it in
    late.set()
    shard.wait(lambda: shard.holding == 0, "the first sender's held call served")
    replica = shard.replicas[member]
    assert replica.has_state and replica.view.view.role == "backup", replica.view.view
    shard.push(PRIMARY, _push(WORKERS[0], 4))
    assert_same_state(shard.services[PRIMARY], shard.services[member])


def test_a_join_held_up_in_the_network_never_replaces_a_newer_joins_sender(
        make_shard: Callable[..., InProcessShard], caplog: pytest.LogCaptureFixture) -> None:
    """A Join of the member's process arriving after a newer one of it was served (held up in the network, or
    sent twice) is refused: its sender would replace the newer Join's, whose calls alone the member takes, and
    the member would get nothing more. The member stays in the view with the primary's state."""
    shard = _rejoin_setup(make_shard)
    member = backup(0)
    shard.lost_replies[(PRIMARY, JoinRequest.METHOD)] = 1  # its first Join served, the reply lost: it joins twice
    replica = shard.add(member)
    with caplog.at_level(logging.INFO, logger="psflow.ps.replication"):
        shard.start(member)
        shard.wait(lambda: sum(f"{member} joins shard 0" in r.getMessage() for r in caplog.records) == 2,
                   "its second Join served")
    shard.wait_view()
    for join_id in (1, 2):  # the lost one's, and the newest (arriving again)
        with pytest.raises(FailedPreconditionError, match=f"Join {join_id} of {member}.*Join 2 was served"):
            shard.call(PRIMARY, JoinRequest.METHOD, JoinRequest(0, member, replica.incarnation, join_id).to_frame())
    shard.push(PRIMARY, _push(WORKERS[0], 4))  # acknowledged by the member, which still takes the sender's calls
    assert replica.has_state and replica.view.view.role == "backup", replica.view.view
    assert_same_state(shard.services[PRIMARY], shard.services[member])


def test_a_member_joining_when_its_primarys_process_is_lost_joins_the_fresh_primary(
        make_shard: Callable[..., InProcessShard]) -> None:
    """The backup restarted and Joined ps:0, whose process was then lost before the backup caught up: ps:0
    restarted, found no member with the shard's state (the backup joining holds none) and started a fresh shard
    with it as a backup, whose sender (no Join) the member refused for good ('sent without a Join refused: this
    member joined it since'), so every push waited for it and the shard stalled; nothing looked after a joining
    member (startup.watch_view: a backup only). A joining member its primary counts among its backups at two
    looks in a row Joins it again."""
    shard = make_shard()
    shard.start()
    shard.start(backup(0))
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    held = shard.held_requests[(backup(0), ReplicateRequest.METHOD)] = threading.Event()
    shard.add(backup(0))  # restarted: it Joins ps:0; the snapshot its Join's sender sends is held up
    shard.start(backup(0))
    shard.wait(lambda: shard.holding >= 1 and shard.status(PRIMARY).backups == (), "the Join served, snapshot held")
    del shard.held_requests[(backup(0), ReplicateRequest.METHOD)]
    shard.add(PRIMARY)  # ps:0's process lost (its held snapshot still reaches the member), a fresh one starts
    held.set()
    shard.start(PRIMARY)
    shard.wait(lambda: shard.status(PRIMARY).backups == (backup(0),) and shard.status(backup(0)).role == "backup",
               "the fresh primary's view with the member a backup")
    shard.register(layout(SyncConfig()))
    shard.push(PRIMARY, _push(WORKERS[0], 1))  # waits for the backup: acknowledged
    assert_same_state(shard.services[PRIMARY], shard.services[backup(0)])


def test_a_join_sent_to_a_member_deposed_meanwhile_follows_the_shards_primary(
        make_shard: Callable[..., InProcessShard]) -> None:
    """watch_view read a member as the primary and Joins it (a let-go or counted joining member, a dropped
    backup), but that member was deposed (a client promoted another) before the Join reached it: it refuses
    every Join ('not the primary'). The joining member used to retry that member for ever, its Join in flight
    for good (so watch_view never looked again): out of the view for the rest of the run. Now a refused Join
    asks the members who is primary and Joins that one. Here: ps_backup:1 rebuilds from ps_backup:0, a backup."""
    from psflow.ps.replication.startup import rebuild
    shard = make_shard(backups=2)
    shard.start()
    shard.start(backup(0))
    shard.start(backup(1))
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    shard.push(PRIMARY, _push(WORKERS[0], 1))
    member = shard.replicas[backup(1)]
    threading.Thread(target=rebuild, args=(member, backup(0)), name="test-rebuild", daemon=True).start()
    shard.wait(lambda: set(shard.status(PRIMARY).backups) == {backup(0), backup(1)}
               and shard.status(backup(1)).role == "backup" and not member.view.join_in_flight,
               "the member that Joined a non-primary back in the primary's view", limit=20.0)
    shard.push(PRIMARY, _push(WORKERS[0], 2))
    assert_same_state(shard.services[PRIMARY], shard.services[backup(1)])


def test_a_member_joining_a_primary_deposed_meanwhile_joins_the_new_primary(
        make_shard: Callable[..., InProcessShard]) -> None:
    """ps_backup:1 restarted and Joined ps:0; before it caught up, ps:0 was cut off and a client promoted
    ps_backup:0. The joining member must end a backup of the new primary's view."""
    shard = make_shard(backups=2)
    shard.start()
    shard.start(backup(0))
    shard.start(backup(1))
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    shard.push(PRIMARY, _push(WORKERS[0], 1))
    held = shard.held_requests[(backup(1), ReplicateRequest.METHOD)] = threading.Event()
    shard.add(backup(1))
    shard.start(backup(1))
    shard.wait(lambda: shard.holding >= 1 and backup(1) not in shard.status(PRIMARY).backups,
               "the Join served, snapshot held")
    del shard.held_requests[(backup(1), ReplicateRequest.METHOD)]
    shard.cut.add(PRIMARY)
    epoch = shard.status(backup(0)).epoch
    shard.promote(backup(0), epoch)
    held.set()
    shard.wait(lambda: backup(1) in shard.status(backup(0)).backups and shard.status(backup(1)).role == "backup"
               and shard.status(backup(1)).primary == backup(0), "the joining member a backup of the new primary",
               limit=20.0)
    shard.push(backup(0), _push(WORKERS[0], 2))
    assert_same_state(shard.services[backup(0)], shard.services[backup(1)])


def test_a_join_served_while_the_primary_is_becoming_keeps_its_sender(
        make_shard: Callable[..., InProcessShard]) -> None:
    """A fresh shard's ps:0 starts its senders to the view's backups (Join-less) while ps_backup:1, which saw it
    primary with state, Joins it. The Join's sender must stay: a Join-less sender started after it was refused by
    the member for good ('sent without a Join refused: this member joined it since'), and the view it restored,
    with the member, made every call wait for it (UNAVAILABLE after replica_timeout, for the rest of the run)."""
    shard = make_shard(backups=2)
    primary, member = shard.replicas[PRIMARY], backup(1)
    add_sender, entered, go = primary.joins.add_sender, threading.Event(), threading.Event()

    def held_add_sender(forwarder, to, incarnation=None, join_id=None):  # type: ignore[no-untyped-def]
        if to == member and incarnation is None:  # the becoming primary's own sender to the member: held
            entered.set()
            go.wait(30.0)
        return add_sender(forwarder, to, incarnation, join_id)

    primary.joins.add_sender = held_add_sender  # type: ignore[method-assign]
    settled, view_settled = threading.Event(), primary.view.settled

    def settling():  # type: ignore[no-untyped-def]
        settled.set()
        return view_settled()

    primary.view.settled = settling  # type: ignore[method-assign]
    joins, join = [0, 0], shard.handlers[PRIMARY][JoinRequest.METHOD]

    def counted_join(frame):  # type: ignore[no-untyped-def]
        joins[0] += 1
        try:
            return join(frame)
        finally:
            joins[1] += 1

    shard.handlers[PRIMARY][JoinRequest.METHOD] = counted_join
    shard.start()
    shard.start(backup(0))
    shard.wait(entered.is_set, "ps:0 becoming primary, at its sender to the member")
    shard.start(member)
    # the member sees ps:0 primary with state and Joins it: served now, or waiting until ps:0 is primary
    shard.wait(lambda: joins[1] >= 1 or settled.is_set(), "the member's Join served or waiting", limit=20.0)
    go.set()
    shard.wait_view(limit=20.0)
    shard.register(layout(SyncConfig()))
    shard.push(PRIMARY, _push(WORKERS[0], 1))
    assert_same_state(shard.services[PRIMARY], shard.services[member])
