"""Models that misbehave on purpose, imported by task processes as ``tests.integration.models_for_tests:Class``."""

from __future__ import annotations

from psflow.data import Batch
from psflow.models import Lookups
from psflow.models.logistic import LogisticRegression


class AsksUndeclared(LogisticRegression):
    """Logistic regression's variables, but its lookups also ask for a variable it never declared."""

    def lookups(self, batch: Batch) -> Lookups:
        return {**super().lookups(batch), "embedding/nope": None}
