"""The checks a member makes itself before a client's view change takes effect (``Promote``, ``DropBackup``).

A client asks for a view change when it found a member gone; its proof may be stale (a channel keeping the
refused connection of a process since restarted) or its own (a link only it lost). Two clients acting on such
proofs from the same epoch could make two primaries at one epoch -- one promoting the backup, the other dropping
that backup at the primary -- each then acknowledging writes alone. So the member the change names asks the other
side itself, once, before it changes its view:

* :func:`refuse_promotion`: a backup told to take over asks its primary's ``ReplicaStatus``; a primary that
  answers as the shard's primary holding the variables at that epoch refuses the promotion.
* :func:`refuse_drop`: a primary told to drop a backup asks it; a backup that answers is not dropped (it
  is alive: the primary's sender reaches it, or it rebuilds by ``Join``).

A member that does not answer (refused, or silent past the status deadline) does not stop the change: a dead
or cut-off member is replaced as before, in about one status round trip. What this cannot tell apart is a
partition between the two members only, each reachable by some client (docs/replication.md, what still loses
data).
"""

from __future__ import annotations

from collections.abc import Callable

from psflow.ps.protocol import ReplicaStatusReply
from psflow.ps.replication.view import PRIMARY, View
from psflow.rpc.api import PreconditionFailed, RpcError

__all__ = ["primary_answers", "backup_answers", "refuse_promotion", "refuse_drop"]


def primary_answers(status_of: Callable[[str], ReplicaStatusReply], primary: str | None, epoch: int,
                    shard: int) -> str | None:
    """Why a promotion at ``epoch`` is refused (``primary`` answers as shard ``shard``'s primary holding its
    variables at ``epoch`` or later), or None (it did not answer, or answered otherwise)."""
    if primary is None:
        return None
    try:
        said = status_of(primary)
    except RpcError:
        return None
    if said.role == "primary" and said.has_state and said.epoch >= epoch:
        return f"{primary} answers as shard {shard}'s primary at epoch {said.epoch}"
    return None


def backup_answers(status_of: Callable[[str], ReplicaStatusReply], backup: str) -> str | None:
    """Why dropping ``backup`` is refused (it answers its status), or None (it did not answer)."""
    try:
        said = status_of(backup)
    except RpcError:
        return None
    return f"{backup} answers ({said.role} at epoch {said.epoch})"


def refuse_promotion(status_of: Callable[[str], ReplicaStatusReply], task: str, view: View, epoch: int,
                     shard: int) -> None:
    """Raises PreconditionFailed (naming ``task`` and why) if member ``task``, whose view is ``view``, must not
    take shard ``shard`` over at ``epoch`` because its primary answers (:func:`primary_answers`)."""
    refused = None if view.role == PRIMARY else primary_answers(status_of, view.primary, epoch, shard)
    if refused is not None:
        raise PreconditionFailed(f"{task}: not promoted: {refused}")


def refuse_drop(status_of: Callable[[str], ReplicaStatusReply], task: str, view: View, backup: str) -> None:
    """Raises PreconditionFailed (naming ``task`` and ``backup``) if primary ``task`` must not drop ``backup``
    from ``view`` because it answers (:func:`backup_answers`)."""
    refused = backup_answers(status_of, backup) if backup in view.backups else None
    if refused is not None:
        raise PreconditionFailed(f"{task}: {backup} not dropped: {refused}")
