"""An in-memory NodeTopology writer for the agent's tests."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RecordingWriter:
    """An in-memory :class:`extender.agent.publish.Writer`: keeps every published object;
    ``fail`` raises once each."""

    uid: str | None = None
    published: list[dict[str, Any]] = field(default_factory=list)
    fail: list[Exception] = field(default_factory=list)
    generation: int = 0

    def node_uid(self, node: str) -> str | None:
        return self.uid

    def publish(self, obj: Mapping[str, Any]) -> None:
        if self.fail:
            raise self.fail.pop(0)
        self.generation += 1
        stored = copy.deepcopy(dict(obj))
        stored["status"]["observedGeneration"] = self.generation
        self.published.append(stored)
