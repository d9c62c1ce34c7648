"""The ps protocol: one typed message per call of ``psflow.ParameterService``.

This package is the only place that spells a wire key (a frame's meta key or
array name) of the ps tasks' calls; the ps client, the service, the checkpoint
code and the in-graph path build and read these messages instead
(tests/unit/ps/test_protocol.py checks that no other module spells one). Each
message is a typed dataclass, frozen for the type checker
(:func:`~psflow.ps.protocol.fields.message`), with ``to_frame()`` (a
:class:`~psflow.rpc.framing.Frame` that shares the message's arrays: nothing
is copied, except that a push, a pull or a pull reply of several partitions
stacks their rows and values into a few arrays, one copy of them; see
``stacking.py``) and, where a peer decodes it, ``from_frame()``, which validates
every field and raises :class:`~psflow.rpc.api.InvalidRequest` naming the
field. Arrays are only looked up here (no loop over their values); the service
checks them against the partitions they name. A request's ``METHOD`` is its
call's name.

Files:
    * ``data.py``: the data path -- ``Register``, ``Pull``, ``PushPull``.
    * ``push.py``: a push -- ``Push`` (with its :class:`WorkerTag` and
      :class:`StepTag`) and its reply, and named gradients as a push's
      arrays (:func:`gradient_arrays`).
    * ``lifecycle.py``: every client's calls around it -- ``Stats``,
      ``Leave``, ``Done``, ``FinalEval``, ``SaveNotice`` (and :class:`Ack`).
    * ``control.py``: the chief's and the checkpoints' calls -- ``Fence``,
      ``LoadShard``, ``SetReady``, ``BeginRestore``, ``ReaderPositions``,
      ``CheckpointStatus``; ``save_shard.py``: a checkpoint save's ``SaveShard``.
    * ``in_graph.py``: the in-graph path's ``RunStep`` (a worker task's call),
      whose gradients travel as a push's (:func:`gradient_arrays`).
    * ``replication.py``: replicated shards (issue 28) -- ``ReplicaStatus``, ``Promote``, ``DropBackup``
      (clients' calls), ``Replicate`` and ``Join`` (between a shard's members).
    * ``fields.py``: the :func:`~psflow.ps.protocol.fields.message` decorator and the checked readers of
      one meta field the messages share.
    * ``stacking.py``: many partitions' rows and values as a few stacked arrays (a Wide & Deep step's 52
      tables: a dozen arrays a call instead of 164), and the checked cut of one partition's range.

================  ================================  ==============================
call              request                           reply
================  ================================  ==============================
Register          :class:`RegisterRequest`          :class:`RegisterReply`
Pull              :class:`PullRequest`              :class:`PullReply`
Push              :class:`PushRequest`              :class:`PushReply`
PushPull          :class:`PushPullRequest`          :class:`PushPullReply`
Stats             (empty)                           :class:`StatsReply`
Leave             :class:`LeaveRequest`             :class:`Ack`
Done              :class:`DoneRequest`              :class:`DoneReply`
FinalEval         :class:`FinalEvalRequest`         :class:`FinalEvalReply`
Shutdown          (empty)                           :class:`Ack`
Fence             :class:`FenceRequest`             :class:`FenceReply`
SaveNotice        :class:`SaveNoticeRequest`        :class:`SaveNoticeReply`
SaveShard         :class:`SaveShardRequest`         :class:`SaveShardReply`
LoadShard         :class:`LoadShardRequest`         :class:`LoadShardReply`
SetReady          :class:`SetReadyRequest`          :class:`SetReadyReply`
BeginRestore      :class:`BeginRestoreRequest`      :class:`BeginRestoreReply`
ReaderPositions   :class:`ReaderPositionsRequest`   :class:`ReaderPositionsReply`
CheckpointStatus  :class:`CheckpointStatusRequest`  :class:`CheckpointStatusReply`
RunStep           :class:`RunStepRequest`           :class:`RunStepReply`
ReplicaStatus     :class:`ReplicaStatusRequest`     :class:`ReplicaStatusReply`
Promote           :class:`PromoteRequest`           :class:`ReplicaStatusReply`
DropBackup        :class:`DropBackupRequest`        :class:`ReplicaStatusReply`
Join              :class:`JoinRequest`              :class:`JoinReply`
Replicate         :class:`ReplicateRequest`         :class:`ReplicateReply`
PushPullAckLater  :class:`PushPullAckLater`         :class:`PushPullAckLaterReply`
Acked             :class:`AckedRequest`             :class:`PushReply`
================  ================================  ==============================

The calls' semantics are the service's (:mod:`psflow.ps.service`,
:mod:`psflow.ps.checkpointing`, :mod:`psflow.ps.run_end`). The frames have the
shape the untyped dicts had (same keys, same array names); the wire is not
kept stable across versions. (``Transport``, which finds a task's TCP carrier,
belongs to the carriers: :mod:`psflow.rpc.tcp`.)
"""

from psflow.ps.protocol.control import (
    BeginRestoreReply,
    BeginRestoreRequest,
    CheckpointStatusReply,
    CheckpointStatusRequest,
    FenceReply,
    FenceRequest,
    LoadShardReply,
    LoadShardRequest,
    ReaderPositionsReply,
    ReaderPositionsRequest,
    SaveOutcome,
    SetReadyReply,
    SetReadyRequest,
)
from psflow.ps.protocol.data import (
    PullReply,
    PullRequest,
    PushPullReply,
    PushPullRequest,
    RegisterReply,
    RegisterRequest,
    Request,
)
from psflow.ps.protocol.in_graph import RunStepReply, RunStepRequest, SparseArrays
from psflow.ps.protocol.lifecycle import (
    Ack,
    DoneReply,
    DoneRequest,
    FinalEvalReply,
    FinalEvalRequest,
    LeaveRequest,
    SaveNoticeReply,
    SaveNoticeRequest,
    StatsReply,
    restore_record,
)
from psflow.ps.protocol.push import (
    GradPart,
    PushReply,
    PushRequest,
    StepTag,
    WorkerTag,
    gradient_arrays,
    gradients_of,
    held_push,
)
from psflow.ps.protocol.replication import (
    ROLES,
    AckedRequest,
    DropBackupRequest,
    JoinReply,
    JoinRequest,
    PartDelta,
    PromoteRequest,
    PushPullAckLater,
    PushPullAckLaterReply,
    ReplicaEntry,
    ReplicaStatusReply,
    ReplicaStatusRequest,
    ReplicateReply,
    ReplicateRequest,
    ack_pending,
    pending_ack,
)
from psflow.ps.protocol.save_shard import SaveShardReply, SaveShardRequest

__all__ = [
    "Ack", "BeginRestoreReply", "BeginRestoreRequest", "CheckpointStatusReply", "CheckpointStatusRequest",
    "DoneReply", "DoneRequest", "FenceReply", "FinalEvalReply", "FinalEvalRequest", "FenceRequest", "GradPart",
    "LeaveRequest", "LoadShardReply",
    "LoadShardRequest", "PullReply", "PullRequest", "PushPullReply", "PushPullRequest", "PushReply", "PushRequest",
    "ReaderPositionsReply", "ReaderPositionsRequest", "RegisterReply", "RegisterRequest", "Request", "RunStepReply",
    "RunStepRequest", "SaveNoticeReply", "SaveNoticeRequest", "SaveOutcome", "SparseArrays",
    "SaveShardReply", "SaveShardRequest", "SetReadyReply", "SetReadyRequest", "StatsReply", "StepTag",
    "WorkerTag", "gradient_arrays", "gradients_of", "held_push", "restore_record",
    "ROLES", "DropBackupRequest", "JoinReply", "JoinRequest", "PartDelta", "PromoteRequest", "ReplicaEntry",
    "ReplicaStatusReply", "ReplicaStatusRequest", "ReplicateReply", "ReplicateRequest",
    "AckedRequest", "PushPullAckLater", "PushPullAckLaterReply", "ack_pending", "pending_ack",
]
