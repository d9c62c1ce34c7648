"""Whether a ps task takes pushes: its readiness and restore generation, and the pushes in flight.

States: *not ready* (fresh, or initialized and awaiting the chief's
restore at start), *restoring* (not ready, a restore in progress) and *ready*
(the chief initialized or restored the task). Transitions: the chief's
registration creates the variables (ready unless the chief restores a
checkpoint first); ``BeginRestore`` closes the gate at the restore's
generation (*restoring*) and waits for the pushes in flight
(:meth:`RestoreGate.drain`); ``SetReady`` opens it (at the new generation
after a restore), which ends the restore.

While a restore is in progress (:attr:`RestoreGate.restoring`) a chief's
``Register`` creates nothing on the task (it replies ``created: false,
ready: false``): the variables ``LoadShard`` loaded so far stay as they are,
so the restore's ``SetReady`` never makes the task ready holding initial
values (:mod:`psflow.ps.variable_store`). A task that is not ready with no
restore in progress (a chief died while initializing it or restoring it at
start, which sends no ``BeginRestore``) is initialized again. A chief's ``Register`` asks and creates under the
restore mutex (:meth:`RestoreGate.creating`, below): a ``BeginRestore`` arriving while it builds the partitions waits
for them, and then finds the restore's loads landing on them. A late copy of a chief's ``Register`` (its call
resent after a broken connection or a failover while the first copy still waited in the network or the server's
queue) that reaches the task once a load wrote it since the creation, or once a later call of the same client (a
later call of its process, or a later process) created the variables, creates nothing either
(:meth:`RestoreGate.superseded`): creating again would replace the values its chief's restore at start (or warm
start) loaded with initial ones, which the chief's ``SetReady`` then opened.

A push that carries a generation is refused (FAILED_PRECONDITION, before
anything is applied) when the task is not ready or holds another generation:
the worker's data position belongs to a model state that was rewound, so it
must re-read it first (:mod:`psflow.train.recovery`). A push without one (a
tool's) is not checked. A ``SetReady`` of a restore is refused when the task
holds another generation (ABORTED, the restore fence, as ``LoadShard``'s below):
a deposed restorer's late one would open the task in the middle of the newer
restore, at the older generation.
A ``SetReady`` with no generation (a chief's after it initialized or restored
at start) is refused while a restore is in progress: it would open the task in
the middle of that restore.
A ``LoadShard`` that carries a generation is refused (:meth:`RestoreGate.check_load`; ABORTED, the restore fence)
unless the task holds that generation and is not ready: a restore's loads come
between its ``BeginRestore`` and its ``SetReady`` (a chief's first restore or
warm start, with no ``BeginRestore``, may send generation 0: the task is not
ready yet); a deposed restorer's late one would overwrite the newer restore's
values. A ``LoadShard`` with no generation is not checked. The fence is asked again where a load changes the task
(:meth:`RestoreGate.loading`), under a mutex ``BeginRestore`` (:meth:`RestoreGate.close`) and ``SetReady``
(:meth:`RestoreGate.open`) take too: a load let in before the arrays it sends were checked is refused there, nothing
changed, if another restore began (or its restore ended) meanwhile, and one changing the task holds them off until it
is done, so no task holds a mix of two restores' state (pushes never take the mutex). ``SetReady``'s own changes (its
sync step's restart, :meth:`RestoreGate.opening`) are made under it too, the fence asked there: a deposed restorer's
``SetReady`` let in before a newer restore began changes nothing of it. A ``SaveShard`` is
refused while a restore is in progress, or when one began during the save
(:meth:`RestoreGate.check_save`): its shard would hold part of the restore, the
other tasks' shards none of it.
Every admitted push is counted until it is released, so a restore can wait
for them.

The gate also keeps, with the generation, the checkpoint a restore loaded here and that checkpoint's global_step
(:meth:`RestoreGate.loaded`, by ``LoadShard``; a warm start is no restore): ``Stats`` names them while the task
holds that generation (:meth:`RestoreGate.restored_from`), so the chief's summaries (their START) and the
launcher's ``restore_loss`` read the step the restore went back to, not the newest checkpoint in the directory,
which a save since may have moved past it. A replicated shard's members carry it in the gate's state
(:meth:`RestoreGate.replica_state`), so a backup, and one promoted, name the primary's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from psflow.rpc.api import FencedOff, PreconditionFailed

__all__ = ["RestoreGate"]


class RestoreGate:
    """Readiness, generation, a restore in progress and pushes in flight of one ps task. Thread-safe."""

    def __init__(self, task_name: str) -> None:
        self.task_name = task_name
        # Entered as the plain lock (cheap: every push takes it twice); waited on through the condition.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        # Held while a LoadShard changes the task (loading), by close and open, and by a chief's Register that may
        # create the variables (creating), before _lock: the generation and readiness a load was let in at hold
        # until it is done. Never taken by a push.
        self._loads = threading.Lock()
        self._creator: int | None = None  # the thread holding _loads by creating (which it may take again)
        self._ready = False
        # 0 until a restore after a ps death; pushes naming another one are refused.
        self._generation = 0
        # BeginRestore closed the gate and no SetReady opened it since: a chief's Register creates nothing.
        self._restoring = False
        self._inflight = 0
        # (generation, checkpoint, its global_step) of the last LoadShard of a restore here
        self._restored: tuple[int, str | None, int] | None = None
        # (client, incarnation, attempt) of the chief's Register that created the variables last (None: unsaid), and
        # whether a load wrote the task since that creation (superseded)
        self._created_by: tuple[str, int, int] | None = None
        self._loaded_since_created = False

    @property
    def ready(self) -> bool:
        """Whether the chief has initialized or restored this task."""
        return self._ready

    @property
    def restoring(self) -> bool:
        """Whether a restore is in progress: ``BeginRestore`` closed the gate and no ``SetReady`` opened it since.
        While it is, a chief's ``Register`` creates nothing here (the loaded variables stay)."""
        return self._restoring

    @property
    def generation(self) -> int:
        """The restore generation this task holds."""
        return self._generation

    def admit(self, generation: int | None) -> None:
        """Counts a push in (until :meth:`release`).

        Raises:
            PreconditionFailed: the push carries a generation and the task is not ready, or holds another.
        """
        with self._lock:
            if generation is not None:
                if not self._ready:
                    raise PreconditionFailed(f"{self.task_name} is not ready (being restored from a checkpoint)")
                if generation != self._generation:
                    raise PreconditionFailed(f"{self.task_name}: push of generation {generation!r:.20} refused: "
                                             f"the cluster was restored (generation {self._generation})")
            self._inflight += 1

    def release(self) -> None:
        """A push admitted by :meth:`admit` is done (applied or refused)."""
        with self._lock:
            self._inflight -= 1
            if not self._inflight:
                self._cond.notify_all()

    def initialized(self, *, ready: bool, by: tuple[str, int | None, int | None] | None = None) -> None:
        """The chief created the variables here; ``ready``: not deferred to a restore (:meth:`open` later). A
        restore in progress (a fresh task's variables created for it) goes on unless ``ready``. ``by``: the
        creating call's (client, incarnation, attempt), which :meth:`superseded` compares later copies with."""
        with self._lock:
            self._ready = ready
            self._restoring = self._restoring and not ready
            client, incarnation, attempt = by if by is not None else ("", None, None)
            self._created_by = (client, incarnation, attempt) if incarnation is not None and attempt is not None \
                else None
            self._loaded_since_created = False

    def superseded(self, client: str, incarnation: int | None, attempt: int | None) -> str | None:
        """Why a chief ``Register`` of ``client`` (its process ``incarnation``, its call ``attempt``) that would create
        the variables anew here (registered, not ready, no restore in progress) must create nothing: the same client
        created them by a later call (a later call of its process, or a later process: this one is over), or by this
        call and a load wrote the task since. Such a copy is late: creating again would replace the loaded values
        with initial ones (or, before the newer call's load, make that load's checked arrays refused and this
        earlier call the creator, after which a late copy of the newer call counted as later). None: it may create
        (another client's call, a later call or process of this one, a call that names no attempt, or a copy of the
        creating call with nothing loaded since: a chief that died while initializing)."""
        with self._lock:
            by = self._created_by
            if by is None or incarnation is None or attempt is None or client != by[0]:
                return None
            if (incarnation, attempt) > by[1:] or ((incarnation, attempt) == by[1:] and not self._loaded_since_created):
                return None
            since = " and a load wrote them since" if self._loaded_since_created else " since"
            return (f"a late copy of the Register of {client} (process {incarnation}, call {attempt}) created "
                    f"nothing on {self.task_name} (generation {self._generation}, not ready): that client's call "
                    f"{by[2]} (process {by[1]}) created the variables{since}, so they stay")

    @contextmanager
    def creating(self) -> Iterator[None]:
        """Held while a chief's ``Register`` asks whether it may create the variables here (:attr:`ready`,
        :attr:`restoring`), creates them and sets the gate (:meth:`initialized`): under the mutex :meth:`loading`,
        :meth:`opening` and :meth:`close` take, so no ``BeginRestore``, load or ``SetReady`` comes between its ask
        and its creation (its fresh partitions never replace a restore's loaded ones, nor does it mark the task
        initialized under a newer restore's feet). A load checked against the partitions it replaced is refused
        (:mod:`psflow.ps.checkpointing`). Taken again by the thread holding it (a replicated
        shard's primary takes it before the lock that orders its entries, the service's ``Register`` inside:
        :mod:`psflow.ps.replication.register_call`), it holds on."""
        me = threading.get_ident()
        if self._creator == me:
            yield
            return
        with self._loads:
            self._creator = me
            try:
                yield
            finally:
                self._creator = None

    def check_open(self, generation: int | None, client: str) -> None:
        """Whether ``client``'s ``SetReady`` of ``generation`` may open the task (:meth:`open`), asked before its
        other effects.

        Raises:
            FencedOff: ``generation`` is not the one this task holds: the ``BeginRestore`` of another restore came
                since (a newer lease's holder restores; this one was deposed), or the task restarted: the restore
                fence (ABORTED, as :meth:`check_load`'s refusal of the same restore's load).
            PreconditionFailed: ``generation`` is None (a chief's SetReady at start, no restore of its own, so no
                fencing token) while a restore is in progress: only that restore's SetReady ends it.
        """
        with self._lock:
            self._check_open(generation, client)

    def check_load(self, generation: int | None) -> None:
        """Whether a ``LoadShard`` of ``generation`` (None: not checked) may change this task, asked before it does.

        Raises:
            FencedOff: the task holds another generation (another restore began here since, or the task
                restarted), or is ready (the restore the load belongs to ended): the restore fence (ABORTED, not
                FAILED_PRECONDITION, so a restorer tells it from any other refusal of its load).
        """
        with self._lock:
            if generation is None or (generation == self._generation and not self._ready):
                return
            state = ("ready at" if self._ready else "at") + f" generation {self._generation}"
            why = "no restore in progress" if generation == self._generation else "another restore began here since"
            raise FencedOff(f"LoadShard of generation {generation} refused: {self.task_name} is {state} "
                                     f"({why}); nothing loaded")

    @contextmanager
    def loading(self, generation: int | None) -> Iterator[None]:
        """Held while a ``LoadShard`` of ``generation`` changes this task: :meth:`check_load` asked again on entry,
        and no :meth:`close` (``BeginRestore``) or :meth:`open` (``SetReady``) until it exits, so the generation and
        readiness the load was let in at hold while it writes. Held only across the changes (memory copies), not
        the load's reading and checking of its arrays; loads of one task change it one at a time.

        Raises:
            FencedOff: as :meth:`check_load` (another restore began, or the load's ended, since the load's first
                ask): nothing changed.
        """
        with self._loads:
            self.check_load(generation)
            yield
            with self._lock:
                self._loaded_since_created = True  # a late copy of the creating Register creates nothing now

    def check_save(self, generation: int | None = None) -> int:
        """Whether a ``SaveShard`` may snapshot this task: asked before the snapshot, and after it with the
        generation the first ask returned. Returns the task's generation.

        Raises:
            PreconditionFailed: a restore is in progress, or (``generation``) one began since the first ask.
        """
        with self._lock:
            if self._restoring or (generation is not None and generation != self._generation):
                raise PreconditionFailed(
                    f"{self.task_name}: refused to save a checkpoint shard: a restore (generation {self._generation}) "
                    f"{'is in progress here' if self._restoring else 'began here during the save'}, so the shard would "
                    "hold part of it; the checkpoints already saved are kept, and the next save takes the restored "
                    "state")
            return self._generation

    def _check_open(self, generation: int | None, client: str) -> None:
        if generation is None and self._restoring:  # a chief's at start (no BeginRestore): not this restore's end
            raise PreconditionFailed(f"SetReady from {client} refused: {self.task_name} is being restored at "
                                     f"generation {self._generation} (BeginRestore came since this client registered, "
                                     f"and that restore's own SetReady makes the task ready)")
        if generation is not None and generation != self._generation:  # the restore fence, as check_load's
            raise FencedOff(f"SetReady of generation {generation} from {client} refused: {self.task_name} "
                            f"is at generation {self._generation} (another restore began here since, and "
                            f"its own SetReady makes the task ready)")

    def open(self, generation: int | None = None, client: str = "the chief") -> None:
        """``SetReady``: the chief finished initializing or restoring; after a restore, at ``generation``. Ends a
        restore in progress.

        Raises:
            PreconditionFailed: as :meth:`check_open` (FencedOff for a replaced generation; nothing changed).
        """
        with self.opening(generation, client):
            pass

    @contextmanager
    def opening(self, generation: int | None, client: str) -> Iterator[None]:
        """:meth:`open`, with the ``SetReady``'s other changes of the task (its sync step's restart) made inside:
        :meth:`check_open` asked on entry under the mutex :meth:`loading` and :meth:`close` take, the task opened
        on exit (not where the block raised), so no ``BeginRestore`` comes between the ask and the changes.

        Raises:
            PreconditionFailed: as :meth:`check_open` (FencedOff for a replaced generation): nothing changed.
        """
        with self._loads:  # after a load changing the task (loading), before a BeginRestore (close)
            with self._lock:
                self._check_open(generation, client)
            yield
            with self._lock:  # asked with the change too, as ever (a replica state written here meanwhile)
                self._check_open(generation, client)
                if generation is not None:
                    self._generation = generation
                self._ready = True
                self._restoring = False

    def close(self, generation: int) -> None:
        """``BeginRestore``: not ready at ``generation``, a restore in progress (:attr:`restoring`) until
        :meth:`open`; pushes of any other generation are refused from now on. Waits for a load changing the task
        (:meth:`loading`): every load of an older generation after it is refused."""
        with self._loads, self._lock:
            self._ready = False
            self._restoring = True
            self._generation = generation

    def loaded(self, checkpoint: str | None, step: int | None, generation: int | None = None) -> None:
        """A ``LoadShard`` of a restore (not a warm start) of ``generation`` (the one :meth:`check_load` let in;
        None: not sent, the one the task holds now) loaded ``checkpoint``, of global_step ``step`` (None: an older
        restorer's load, which names neither: nothing kept). Kept only where the task still holds that generation: a
        ``BeginRestore`` that came during the load is not named by it, and the record of that next restore's own
        load, where it came first, is not replaced by this stale one (only the generation held is ever read)."""
        with self._lock:
            if step is not None and (generation is None or generation == self._generation):
                self._restored = (self._generation, checkpoint, step)

    def restored_from(self) -> tuple[int, str | None, int | None]:
        """The generation this task holds, and (read with it) the checkpoint its restore loaded here and that
        checkpoint's global_step; (None, None) for these where none did (a ``BeginRestore`` moved the generation
        on, its loads not come yet; a task never restored)."""
        with self._lock:
            restored = self._restored
            if restored is None or restored[0] != self._generation:
                return self._generation, None, None
            return restored

    def drain(self, timeout: float) -> bool:
        """Waits up to ``timeout`` s for the pushes in flight; True if they all finished."""
        with self._lock:
            return self._cond.wait_for(lambda: self._inflight == 0, timeout=timeout)

    def replica_state(self) -> dict[str, object]:
        """Readiness, generation, whether a restore is in progress, what the last one loaded, and the creating
        ``Register``'s call with whether a load wrote the task since (:meth:`superseded`; :mod:`psflow.ps.replication`)."""
        with self._lock:
            return {"ready": self._ready, "generation": self._generation, "restoring": self._restoring,
                    "restored": list(self._restored) if self._restored is not None else None,
                    "created_by": list(self._created_by) if self._created_by is not None else None,
                    "loaded_since_created": self._loaded_since_created}

    def load_replica_state(self, state: dict[str, object]) -> None:
        """Sets readiness, generation, the restore in progress and the creating call to ``state`` (a
        :meth:`replica_state` of the shard's primary), so a promoted backup refuses a late ``Register`` copy too."""
        ready, generation, restoring = state.get("ready"), state.get("generation"), state.get("restoring")
        restored = state.get("restored")
        with self._lock:
            if isinstance(restored, list) and len(restored) == 3:  # (absent: an older primary's, kept as it is)
                gen, checkpoint, step = restored
                if type(gen) is int and type(step) is int and (checkpoint is None or isinstance(checkpoint, str)):
                    self._restored = (gen, checkpoint, step)
            elif restored is None and "restored" in state:
                self._restored = None
            if isinstance(ready, bool):
                self._ready = ready
            if isinstance(restoring, bool):
                self._restoring = restoring
            if isinstance(generation, int):
                self._generation = generation
            by, loaded = state.get("created_by"), state.get("loaded_since_created")
            if isinstance(loaded, bool):  # (absent: an older primary's, kept as they are)
                self._loaded_since_created = loaded
                self._created_by = None
                if isinstance(by, list) and len(by) == 3 and isinstance(by[0], str) and type(by[1]) is int \
                        and type(by[2]) is int:
                    self._created_by = (by[0], by[1], by[2])
