"""Named gang templates: the built-in ones (``data/templates.yaml``) and the way back to data."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import yaml

from extender.cost import Comm, ModelDims
from extender.placement.files import gang_from_data
from extender.placement.request import GangRequest
from extender.sim.life import Life, split_life

_DATA = "data"


def read_data_file(name: str) -> str:
    """A file shipped in ``extender/sim/data`` (the default cluster, the templates)."""
    return resources.files("extender.sim").joinpath(_DATA, name).read_text("utf-8")


@functools.cache
def builtin_template_data() -> dict[str, Any]:
    data = yaml.safe_load(read_data_file("templates.yaml"))
    assert isinstance(data, dict), "templates.yaml: expected a mapping of template name to gang"
    return data


@functools.cache
def builtin_templates() -> dict[str, GangRequest]:
    return {
        name: gang_from_data(split_life(spec, f"templates.yaml: {name}.")[0], f"templates.yaml: {name}")
        for name, spec in builtin_template_data().items()
    }


@functools.cache
def builtin_template_life() -> dict[str, Life]:
    return {
        name: split_life(spec, f"templates.yaml: {name}.")[1]
        for name, spec in builtin_template_data().items()
    }


_DIM_FIELDS = (
    ("hidden_size", "hiddenSize"),
    ("bytes_per_element", "bytesPerElement"),
    ("tokens", "tokens"),
    ("layers", "layers"),
    ("kv_heads", "kvHeads"),
    ("head_dim", "headDim"),
    ("experts_per_token", "expertsPerToken"),
    ("parameters", "parameters"),
    ("active_parameters", "activeParameters"),
)


def gang_to_data(gang: GangRequest) -> dict[str, Any]:
    """The gang-file content of a request (the inverse of ``files.gang_from_data``), leaving
    out what equals the defaults."""
    default = ModelDims()
    pod_sets: list[dict[str, Any]] = []
    for ps in gang.pod_sets:
        d: dict[str, Any] = {"name": ps.name, "count": ps.count, "gpusPerPod": ps.gpus_per_pod}
        if ps.comm != Comm.NONE:
            d["comm"] = ps.comm.value
        if ps.required_level:
            d["requiredLevel"] = ps.required_level
        if ps.preferred_level:
            d["preferredLevel"] = ps.preferred_level
        if ps.colocate_with:
            d["colocateWith"] = {"podSet": ps.colocate_with.pod_set, "level": ps.colocate_with.level}
        model = {
            key: getattr(ps.model, attr)
            for attr, key in _DIM_FIELDS
            if getattr(ps.model, attr) != getattr(default, attr)
        }
        if model:
            d["model"] = model
        plain = {r.key: r.values[0] for r in ps.node_selector if r.operator == "In" and len(r.values) == 1}
        if plain:
            d["nodeSelector"] = plain
        rest = [r for r in ps.node_selector if r.key not in plain or r.operator != "In" or len(r.values) != 1]
        if rest:
            d["nodeAffinity"] = [
                {"key": r.key, "operator": r.operator, **({"values": list(r.values)} if r.values else {})}
                for r in rest
            ]
        pod_sets.append(d)
    return {"name": gang.name, "podSets": pod_sets}
