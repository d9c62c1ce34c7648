"""``VariableSet``: declare a model's variables, TensorFlow style.

A model declares its variables once, in order, with :meth:`get_variable`
(``tf.compat.v1.get_variable``'s shape of call) and optionally pins some with
``with variables.device("/job:ps/task:1"):``. Each declaration is placed at
once by the set's :class:`~psflow.placement.device_setter.DeviceSetter`, so
the layout is a pure function of the declarations, their order, the strategy
and the number of ps tasks: every client running the same model code gets the
same :meth:`placements`, and ``to_json()`` gives the same text.

Example:
    >>> from psflow.placement.device_setter import replica_device_setter
    >>> from psflow.placement.partitioners import fixed_size_partitioner
    >>> variables = VariableSet(replica_device_setter(2))
    >>> w = variables.get_variable("w", (784, 10))  # assigned to /job:ps/task:0
    >>> b = variables.get_variable("b", (10,))      # assigned to /job:ps/task:1
    >>> with variables.device("/job:ps/task:1"):
    ...     step = variables.get_variable("global_step", (), dtype="int64")
    >>> emb = variables.get_variable(                # parts on tasks 0, 1, 0
    ...     "emb", (1000, 16), partitioner=fixed_size_partitioner(3))
    >>> [p.task for p in emb.partitions], [p.num_rows for p in emb.partitions]
    ([0, 1, 0], [334, 333, 333])
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from psflow.placement.api import Partitioner, PlacementError, VariableDef
from psflow.placement.assignment import VariablePlacement, placements_to_json
from psflow.placement.device_setter import DeviceSetter

__all__ = ["VariableSet"]


class VariableSet:
    """The ordered variables of one model and where each lives.

    Not thread-safe: declare variables from one thread, as model code does.

    Args:
        setter: Places each variable; use a fresh one per set, since its
            strategy keeps state.
    """

    def __init__(self, setter: DeviceSetter) -> None:
        self._setter = setter
        self._placements: dict[str, VariablePlacement] = {}
        self._storage_owner: dict[str, str] = {}
        self._devices: list[str] = []

    @property
    def setter(self) -> DeviceSetter:
        """The device setter placing this set's variables."""
        return self._setter

    @contextmanager
    def device(self, spec: str) -> Iterator[None]:
        """Pins variables declared inside the block to ``spec``.

        The innermost block wins. A spec naming the ps job but no task
        (``"/job:ps"``) leaves the choice to the strategy.

        Args:
            spec: Device such as ``"/job:ps/task:1"``.

        Raises:
            PlacementError: On entry, if ``spec`` is invalid or names a task
                that does not exist, e.g. ``no task 3 in job 'ps' (tasks
                0-1)``.
        """
        self._setter.check_device(spec)
        self._devices.append(spec)
        try:
            yield
        finally:
            self._devices.pop()

    def get_variable(
        self,
        name: str,
        shape: Sequence[int],
        *,
        dtype: str = "float32",
        initializer: Mapping[str, object] | None = None,
        partitioner: Partitioner | None = None,
        optimizer: Mapping[str, object] | None = None,
        trainable: bool = True,
        dynamic: Mapping[str, object] | None = None,
        moving_average_decay: float | None = None,
    ) -> VariablePlacement:
        """Declares a variable and places it.

        Unlike TensorFlow's ``get_variable`` there is no reuse: each name is
        declared once.

        Args:
            name: Variable name, e.g. ``"dense/kernel"``.
            shape: Its shape.
            dtype: Its dtype (see ``DTYPE_SIZES``).
            initializer: Opaque JSON-able initializer config; default zeros.
            partitioner: Splits it along axis 0 (see ``partitioners``).
            optimizer: Opaque per-variable optimizer config; ``None`` uses the
                model's optimizer.
            trainable: Whether gradients are pushed for it.
            dynamic: Options of a dynamic table (shape ``(0, dim)``; see
                :attr:`~psflow.placement.api.VariableDef.dynamic`): spread by id
                over every ps task (or the pinned one), never partitioned by rows.
            moving_average_decay: keep a moving average of it on the ps tasks
                with this decay (see :attr:`~psflow.placement.api.VariableDef.moving_average_decay`).

        Returns:
            Its placement.

        Raises:
            PlacementError: If the name is already declared (or collides with
                a partition name such as ``w/part_0``), or the definition or
                placement is invalid. Nothing is recorded on error, though
                the strategy may have advanced.
        """
        if name in self._placements:
            raise PlacementError(f"variable {name!r} is already declared with shape {self._placements[name].var.shape}")
        var = VariableDef(
            name,
            tuple(shape),
            dtype=dtype,
            initializer={"name": "zeros"} if initializer is None else initializer,
            optimizer=optimizer,
            trainable=trainable,
            dynamic=dynamic,
            moving_average_decay=moving_average_decay,
        )
        placement = self._setter.place(
            var,
            partitioner=partitioner,
            device=self._devices[-1] if self._devices else None,
        )
        for storage in placement.storage_names():
            owner = self._storage_owner.get(storage)
            if owner is not None:
                raise PlacementError(f"variable {name!r}: storage name {storage!r} is already used by variable {owner!r}")
        self._placements[name] = placement
        for storage in placement.storage_names():
            self._storage_owner[storage] = name
        return placement

    def placements(self) -> tuple[VariablePlacement, ...]:
        """All placements, in declaration order."""
        return tuple(self._placements.values())

    def to_json(self) -> str:
        """Deterministic JSON list of the placements, in declaration order.

        ``placements_from_json`` parses it back.
        """
        return placements_to_json(self.placements())

    def __len__(self) -> int:
        return len(self._placements)

    def __contains__(self, name: object) -> bool:
        return name in self._placements

    def __getitem__(self, name: str) -> VariablePlacement:
        try:
            return self._placements[name]
        except KeyError:
            raise PlacementError(f"no variable {name!r} is declared") from None
