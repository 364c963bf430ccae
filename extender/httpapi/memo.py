"""Answers remembered per (pod rule, node-name list) while the cluster cache stands still.

kube-scheduler sends the same node list (every node that passed its own filters, in the
same order) for pod after pod, and many pods ask the same thing (4 GPUs, no level): with
nothing changed in between, the answer for a rule over that list is the one given last
time. A memo entry is valid for one cache version only (the version grows with every
change to what a node offers: a pod binding, a reservation made or released, a node
added), so a version change empties the memo; entries are also bounded in number. Binding
a reservation's slot changes no version: answers that depend on slots carry their slot
nodes (and reason) in the rule.
Callers must treat the remembered values as read-only: they are shared between requests.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

V = TypeVar("V")

#: Distinct (rule, node list) answers kept; kube-scheduler sends few distinct lists.
MEMO_SIZE = 32


class NamesKey:
    """A node-name list as a memo key: its names in order, hashed once (a tuple of 5,000
    names would be hashed again on every dictionary operation)."""

    __slots__ = ("_hash", "names")

    def __init__(self, names: Sequence[str]) -> None:
        self.names: tuple[str, ...] = tuple(names)
        self._hash = hash(self.names)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NamesKey):
            return NotImplemented
        return self is other or (self._hash == other._hash and self.names == other.names)


class NamesMemo(Generic[V]):
    """Values by (rule, node-name list), valid for one cache version; the oldest entry
    goes first when the memo is full."""

    def __init__(self, size: int = MEMO_SIZE) -> None:
        self.size = size
        self._version: int | None = None
        self._entries: dict[tuple[Hashable, NamesKey], V] = {}

    def _at(self, version: int) -> dict[tuple[Hashable, NamesKey], V]:
        if version != self._version:
            self._entries.clear()
            self._version = version
        return self._entries

    def get(self, version: int, rule: Hashable, names: NamesKey) -> V | None:
        return self._at(version).get((rule, names))

    def put(self, version: int, rule: Hashable, names: NamesKey, value: V) -> V:
        entries = self._at(version)
        entries[(rule, names)] = value
        while len(entries) > self.size:
            del entries[next(iter(entries))]
        return value

    def __len__(self) -> int:
        return len(self._entries)
