"""A simulation trace: deployments of gangs that arrive, scale and go away.

Trace file (YAML, or JSON Lines with one event per line)::

    templates:                       # optional: named gangs, added to the built-in ones
      my-model: {name: my-model, podSets: [{name: server, count: 1, gpusPerPod: 8}]}
      # a template may also say owner, maxSurge, maxUnavailable, loadSeconds (extender/sim/life.py)
    events:
      - at: 0                        # seconds from the start of the trace
        deployment: chat             # optional name; unique
        template: llama-70b-tp8      # a named template, or
        # gang: {podSets: [...]}     # inline gang-file content
        replicas: 2                  # optional, default 1: gangs started at once
        lifetime: 7200               # seconds until the deployment and all its replicas go
      - at: 3600
        scale: chat                  # scale a running deployment
        replicas: 4                  # to this many replicas
      - at: 5400
        rollout: chat                # roll a running deployment to a new revision
      - at: 7000
        nodeDown: h100-h1-3          # a node fails: its gangs lose their slots
        repairAfter: 7200            # seconds until it is back

A rollout replaces every replica by one of a new revision, as the deployment's owner does
(:mod:`extender.sim.life`). A bare list of events is accepted too. In JSON Lines, a line
``{"templates": {...}}`` defines templates. Every replica is one gang, named ``<deployment>-<n>``.

Bounds. A trace file is read as :mod:`extender.placement.reading` reads every file (at most
16 MiB of UTF-8, values nested at most 64 levels, at most 1,000,000 values with YAML aliases
expanded; JSON Lines without ``NaN`` or ``Infinity``), its gangs are bounded as gang files
are (:mod:`extender.placement.files`), and its own values by :data:`LIMITS`: at most 100,000
events, 10,000 replicas (an event's ``replicas``, a template's ``maxSurge`` and
``maxUnavailable``), and times (``at``, ``lifetime``, ``repairAfter``, ``loadSeconds``) finite
and within a year of simulated time, 31,536,000 seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from extender.placement.files import FileError, gang_from_data
from extender.placement.reading import load_json, parse_yaml, read_text, shown
from extender.placement.request import GangRequest
from extender.sim.life import MAX_AMOUNT, MAX_SECONDS, Life, LifeError, split_life
from extender.sim.templates import (
    builtin_template_data,
    builtin_template_life,
    builtin_templates,
    gang_to_data,
)

#: The most a trace file may say, by what is bounded (see the module docstring).
LIMITS: dict[str, int] = {
    "events in a trace": 100_000,
    "replicas (and a template's maxSurge, maxUnavailable)": MAX_AMOUNT,
    "seconds (at, lifetime, repairAfter, loadSeconds)": MAX_SECONDS,
}
MAX_EVENTS = LIMITS["events in a trace"]
MAX_REPLICAS = LIMITS["replicas (and a template's maxSurge, maxUnavailable)"]


class TraceError(FileError):
    """A trace that cannot be used; the message names the file, the event, the field."""


@dataclass(frozen=True)
class Deployment:
    name: str
    at: float
    lifetime: float
    replicas: int
    #: The gang every replica runs (its name is replaced by the replica's).
    gang: GangRequest
    template: str | None = None
    life: Life = field(default_factory=Life)
    #: Where it was defined, as the prefix of a field in error messages (``trace.yaml: events[3].``).
    origin: str = field(default="", compare=False)

    @property
    def end(self) -> float:
        return self.at + self.lifetime


@dataclass(frozen=True)
class Scale:
    at: float
    deployment: str
    replicas: int
    origin: str = field(default="", compare=False)


@dataclass(frozen=True)
class Rollout:
    at: float
    deployment: str
    origin: str = field(default="", compare=False)


@dataclass(frozen=True)
class NodeDown:
    at: float
    node: str
    repair_s: float
    origin: str = field(default="", compare=False)

    @property
    def back(self) -> float:
        return self.at + self.repair_s


@dataclass(frozen=True)
class Trace:
    deployments: tuple[Deployment, ...]
    scales: tuple[Scale, ...] = ()
    source: str = "trace"
    #: Templates the trace defined itself (not the built-in ones), by name, and their lives.
    templates: Mapping[str, GangRequest] = field(default_factory=dict)
    rollouts: tuple[Rollout, ...] = ()
    node_downs: tuple[NodeDown, ...] = ()
    template_lives: Mapping[str, Life] = field(default_factory=dict)

    @property
    def end(self) -> float:
        return max((d.end for d in self.deployments), default=0.0)

    def to_data(self) -> dict[str, Any]:
        """The trace as a trace file's content (reads back to the same trace)."""
        events: list[tuple[float, int, dict[str, Any]]] = []
        for k, d in enumerate(self.deployments):
            ev: dict[str, Any] = {"at": d.at, "deployment": d.name}
            if d.template is not None:
                ev["template"] = d.template
            else:
                ev["gang"] = {**gang_to_data(d.gang), **d.life.to_data()}
            ev["replicas"] = d.replicas
            ev["lifetime"] = d.lifetime
            events.append((d.at, k, ev))
        n = len(events)
        for k, s in enumerate(self.scales):
            events.append((s.at, n + k, {"at": s.at, "scale": s.deployment, "replicas": s.replicas}))
        n = len(events)
        for k, r in enumerate(self.rollouts):
            events.append((r.at, n + k, {"at": r.at, "rollout": r.deployment}))
        n = len(events)
        for k, f in enumerate(self.node_downs):
            events.append((f.at, n + k, {"at": f.at, "nodeDown": f.node, "repairAfter": f.repair_s}))
        events.sort(key=lambda e: (e[0], e[1]))
        out: dict[str, Any] = {}
        if self.templates:
            out["templates"] = {
                name: {**gang_to_data(g), **self.template_lives.get(name, Life()).to_data()}
                for name, g in self.templates.items()
            }
        out["events"] = [e for _, _, e in events]
        return out


def _label(where: str) -> str:
    return where.rstrip(". :")


_DEPLOYMENT_FIELDS = ("at", "deployment", "template", "gang", "replicas", "lifetime")
_SCALE_FIELDS = ("at", "scale", "replicas")
_ROLLOUT_FIELDS = ("at", "rollout")
_NODE_DOWN_FIELDS = ("at", "nodeDown", "repairAfter")
#: (the field that marks the kind, its fields, its name in errors); the last is the default.
_KINDS: tuple[tuple[str | None, tuple[str, ...], str], ...] = (
    ("scale", _SCALE_FIELDS, "a scale event"),
    ("rollout", _ROLLOUT_FIELDS, "a rollout event"),
    ("nodeDown", _NODE_DOWN_FIELDS, "a node-down event"),
    (None, _DEPLOYMENT_FIELDS, "a deployment event"),
)


def _number(ev: Mapping[str, Any], key: str, where: str, minimum: float, strict: bool) -> float:
    """A number of seconds: finite, above (or from) ``minimum``, at most :data:`MAX_SECONDS`."""
    value = ev.get(key)
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok:
        assert isinstance(value, int | float)
        ok = (value > minimum if strict else value >= minimum) and value <= MAX_SECONDS
    if not ok:
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        got = "missing" if key not in ev else f"got {shown(value)}"
        raise TraceError(
            f"{where}{key}: expected a number {bound}, at most {MAX_SECONDS} seconds (a year), {got}"
        )
    return float(value)  # type: ignore[arg-type]


def _count(ev: Mapping[str, Any], key: str, where: str, default: int | None) -> int:
    if key not in ev and default is not None:
        return default
    value = ev.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_REPLICAS:
        got = "missing" if key not in ev else f"got {shown(value)}"
        raise TraceError(f"{where}{key}: expected a whole number from 0 to {MAX_REPLICAS}, {got}")
    return value


def _name(ev: Mapping[str, Any], key: str, where: str) -> str:
    value = ev.get(key)
    if not isinstance(value, str) or not value.strip():
        raise TraceError(f"{where}{key}: expected a non-empty name, got {shown(value)}")
    return value


def _gang_and_life(spec: Any, where: str) -> tuple[GangRequest, Life]:
    """A gang and its life from gang-file content that may carry the keys of ``life.LIFE_KEYS``."""
    life = Life()
    if isinstance(spec, dict):
        try:
            spec, life = split_life(spec, f"{where}.")
        except LifeError as exc:
            raise TraceError(str(exc)) from None
    return gang_from_data(spec, where), life


def _templates(data: Any, where: str) -> tuple[dict[str, GangRequest], dict[str, Life]]:
    if not isinstance(data, dict):
        raise TraceError(f"{where}: expected a mapping of template name to gang")
    gangs, lives = {}, {}
    for name, spec in data.items():
        if isinstance(spec, dict) and "name" not in spec:
            spec = {"name": str(name), **spec}
        gangs[str(name)], lives[str(name)] = _gang_and_life(spec, f"{where}.{name}")
    return gangs, lives


class _Builder:
    def __init__(self, source: str) -> None:
        self.source = source
        self.templates: dict[str, GangRequest] = {}
        self.lives: dict[str, Life] = {}
        self.deployments: list[Deployment] = []
        self.scales: list[Scale] = []
        self.rollouts: list[Rollout] = []
        self.node_downs: list[NodeDown] = []
        self.events = 0

    def add_templates(self, data: Any, where: str) -> None:
        try:
            gangs, lives = _templates(data, where)
        except TraceError:
            raise
        except FileError as exc:
            raise TraceError(str(exc)) from None
        self.templates.update(gangs)
        self.lives.update(lives)

    def add_event(self, ev: Any, where: str) -> None:
        """``where`` ends with the separator before a field name (``events[3].``)."""
        self.events += 1
        if self.events > MAX_EVENTS:
            raise TraceError(
                f"{_label(where)}: more than {MAX_EVENTS} events; a trace has at most {MAX_EVENTS}"
            )
        if not isinstance(ev, dict):
            raise TraceError(f"{_label(where)}: expected a mapping (an event), got {type(ev).__name__}")
        kind, what = next((k, w) for m, k, w in _KINDS if m is None or m in ev)
        for key in ev:
            if key not in kind:
                raise TraceError(f"{where}{key}: unknown field in {what}; known: {', '.join(kind)}")
        at = _number(ev, "at", where, 0, strict=False)
        if "scale" in ev:
            self.scales.append(
                Scale(at, _name(ev, "scale", where), _count(ev, "replicas", where, None), where)
            )
            return
        if "rollout" in ev:
            self.rollouts.append(Rollout(at, _name(ev, "rollout", where), where))
            return
        if "nodeDown" in ev:
            repair = _number(ev, "repairAfter", where, 0, strict=True)
            self.node_downs.append(NodeDown(at, _name(ev, "nodeDown", where), repair, where))
            return
        lifetime = _number(ev, "lifetime", where, 0, strict=True)
        replicas = _count(ev, "replicas", where, 1)
        if ("template" in ev) == ("gang" in ev):
            raise TraceError(f"{where}gang: give exactly one of template (a name) or gang (inline)")
        template: str | None = None
        if "template" in ev:
            template = _name(ev, "template", where)
            found = self.templates.get(template) or builtin_templates().get(template)
            if found is None:
                known = sorted({*self.templates, *builtin_template_data()})
                raise TraceError(f"{where}template: unknown template {template!r}; known: {', '.join(known)}")
            gang = found
            life = self.lives.get(template) or builtin_template_life().get(template, Life())
        else:
            spec = ev["gang"]
            if isinstance(spec, dict) and "name" not in spec:
                spec = {"name": str(ev.get("deployment", "gang")), **spec}
            try:
                gang, life = _gang_and_life(spec, f"{where}gang")
            except TraceError:
                raise
            except FileError as exc:
                raise TraceError(str(exc)) from None
        name = ev.get("deployment")
        if name is None:
            name = f"{template or gang.name}-{len(self.deployments)}"
        else:
            name = _name(ev, "deployment", where)
        self.deployments.append(Deployment(name, at, lifetime, replicas, gang, template, life, where))

    def build(self) -> Trace:
        by_name: dict[str, Deployment] = {}
        for d in self.deployments:
            if d.name in by_name:
                raise TraceError(
                    f"{d.origin}deployment: name {d.name!r} already used by {_label(by_name[d.name].origin)}"
                )
            by_name[d.name] = d
        named: list[tuple[Scale | Rollout, str]] = [(s, "scale") for s in self.scales]
        named += [(r, "rollout") for r in self.rollouts]
        for ev, word in named:
            target = by_name.get(ev.deployment)
            if target is None:
                raise TraceError(f"{ev.origin}{word}: no deployment named {ev.deployment!r} in the trace")
            if not target.at <= ev.at < target.end:
                raise TraceError(
                    f"{ev.origin}at: deployment {target.name} runs from {target.at:g} s to {target.end:g} s, "
                    f"not at {ev.at:g} s"
                )
        if not self.deployments:
            raise TraceError(f"{self.source}: events: the trace has no deployments")
        order = sorted(range(len(self.deployments)), key=lambda k: (self.deployments[k].at, k))
        return Trace(
            tuple(self.deployments[k] for k in order),
            tuple(sorted(self.scales, key=lambda s: s.at)),
            self.source,
            dict(self.templates),
            tuple(sorted(self.rollouts, key=lambda r: r.at)),
            tuple(sorted(self.node_downs, key=lambda f: f.at)),
            dict(self.lives),
        )


def trace_from_data(data: Any, source: str = "trace") -> Trace:
    """A trace from a trace file's parsed YAML content."""
    b = _Builder(source)
    if isinstance(data, dict):
        unknown = sorted(set(data) - {"templates", "events"})
        if unknown:
            raise TraceError(f"{source}: {unknown[0]}: unknown top-level field; known: templates, events")
        if "templates" in data:
            b.add_templates(data["templates"], f"{source}: templates")
        events = data.get("events")
        if not isinstance(events, list):
            raise TraceError(f"{source}: events: expected a list of events")
    elif isinstance(data, list):
        events = data
    else:
        raise TraceError(f"{source}: expected a mapping with events, or a list of events")
    for i, ev in enumerate(events):
        b.add_event(ev, f"{source}: events[{i}].")
    return b.build()


def trace_from_lines(lines: Sequence[str], source: str = "trace") -> Trace:
    b = _Builder(source)
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            ev = load_json(line, f"{source}: line {n}")
        except FileError as exc:
            raise TraceError(str(exc)) from None
        if isinstance(ev, dict) and set(ev) == {"templates"}:
            b.add_templates(ev["templates"], f"{source}: line {n}: templates")
        else:
            b.add_event(ev, f"{source}: line {n}: ")
    return b.build()


def load_trace(path: str | Path) -> Trace:
    p = Path(path)
    try:
        text = read_text(p)
        if p.suffix.lower() in (".jsonl", ".ndjson"):
            return trace_from_lines(text.splitlines(), str(p))
        data = parse_yaml(text, str(p))
    except TraceError:
        raise
    except FileError as exc:
        raise TraceError(str(exc)) from None
    return trace_from_data(data, str(p))
