"""The policies a simulation can compare: gangslice and the peers' baselines."""

from __future__ import annotations

from extender.sim.engine import Policy


def available_policies() -> dict[str, Policy]:
    """Every policy by name, gangslice first (``extender.peers.POLICIES`` when
    that module is present, else the gangslice solver alone)."""
    try:
        from extender.peers import POLICIES
    except ModuleNotFoundError as exc:
        if exc.name != "extender.peers":
            raise
        from extender.placement.solver import place

        return {"gangslice": place}
    return dict(POLICIES)


def choose(names: str | None) -> dict[str, Policy]:
    """The policies a ``--policies a,b`` list names, in that order (all when None).
    Raises ValueError naming an unknown policy."""
    known = available_policies()
    if names is None:
        return known
    chosen: dict[str, Policy] = {}
    for raw in names.split(","):
        name = raw.strip()
        if not name:
            continue
        if name not in known:
            raise ValueError(f"unknown policy {name!r}; known: {', '.join(known)}")
        chosen[name] = known[name]
    if not chosen:
        raise ValueError(f"no policy named; known: {', '.join(known)}")
    return chosen
