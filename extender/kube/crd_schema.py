"""The gangslice CRDs, generated from the pydantic models of :mod:`extender.kube.crd_models`.

``python -m extender.kube.crd_schema --output manifests/crds`` (``make crds``) writes one
file per kind; ``--check`` exits 1 naming ``make crds`` when a file differs from what the
models give. A model's JSON schema becomes a structural OpenAPI v3 schema: ``$ref`` inlined,
an optional field (``X | None``) is the plain type and left out of ``required`` (gangslice
leaves such fields out rather than writing null) unless the field says ``nullable``;
``exclusiveMinimum: N`` becomes ``minimum: N`` with ``exclusiveMinimum: true``; titles,
pydantic's defaults and ``additionalProperties: false`` (the API server prunes unknown
fields anyway) are dropped; ``crdDefault`` becomes the schema's ``default``. Any other
construct is refused, so the generator never writes a schema the API server would reject.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from extender.kube import crd_models, names

#: Keys carried into the CRD, in the order they are written.
_KEYS = (
    "type",
    "description",
    "format",
    "enum",
    "default",
    "minimum",
    "exclusiveMinimum",
    "minLength",
    "pattern",
    "nullable",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "required",
    "properties",
    "items",
    "additionalProperties",
)
_DROPPED = {"title", "default", "$defs"}


class SchemaGenerationError(ValueError):
    """A model construct with no structural OpenAPI counterpart."""


@dataclass(frozen=True)
class CrdSpec:
    """What a CRD says besides its schema."""

    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    scope: str
    model: type[BaseModel]
    description: str
    comment: str
    printer_columns: tuple[Mapping[str, Any], ...]

    @property
    def file_name(self) -> str:
        return f"{names.GROUP}_{self.plural}.yaml"


NODE_TOPOLOGY = CrdSpec(
    kind="NodeTopology",
    plural=names.NODE_TOPOLOGIES,
    singular="nodetopology",
    short_names=("ntopo",),
    scope="Cluster",
    model=crd_models.NodeTopologyObject,
    description="The GPU graph of one node (GPUs, links, NICs, clique, health) and the devices in use.",
    comment=(
        "NodeTopology: one per node, named after the node, written by the gangslice node agent.\n"
        "spec = extender.topology.serialize.graph_to_dict(graph) plus the devices in use, the\n"
        "devices the kubelet can allocate and where the graph came from."
    ),
    printer_columns=(
        # A printer column shows only the first JSONPath result, so GPUs lists the
        # allocatable device IDs themselves rather than a count (the contract has no count).
        {
            "name": "GPUs",
            "type": "string",
            "description": "device IDs the kubelet can allocate",
            "jsonPath": ".spec.allocatableDevices",
        },
        {
            "name": "Source",
            "type": "string",
            "description": "where the graph came from (nvml, nvidia-smi, none)",
            "jsonPath": ".spec.source",
        },
        {"name": "Model", "type": "string", "jsonPath": ".spec.model", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ),
)

SLICE_RESERVATION = CrdSpec(
    kind="SliceReservation",
    plural=names.SLICE_RESERVATIONS,
    singular="slicereservation",
    short_names=("slres",),
    scope="Namespaced",
    model=crd_models.SliceReservationObject,
    description="A slice of GPUs held for a gang (every pod's node, GPU indices, NUMA node).",
    comment=(
        "SliceReservation: a slice of GPUs held for one gang until its pods bind or the hold expires.\n"
        "Namespaced, owned (ownerReferences, controller=true) by the gang's Workload or PodGroup, so\n"
        "deleting the owner frees it. spec is the ledger's Reservation.to_dict() exactly\n"
        "(extender/placement/ledger.py), all a restart reads back; status is for people and kubectl\n"
        "(phase, which pod holds which slot, nodes, GPUs), written through the status subresource by\n"
        "whoever writes the object and again whenever a slot binds or is freed."
    ),
    printer_columns=(
        {"name": "Gang", "type": "string", "jsonPath": ".spec.gang"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {
            "name": "Nodes",
            "type": "string",
            "description": "nodes of the slice, comma-separated",
            "jsonPath": ".status.nodes",
        },
        {"name": "GPUs", "type": "integer", "description": "GPUs held", "jsonPath": ".status.gpus"},
        {
            "name": "Cost",
            "type": "number",
            "description": "predicted communication time per layer, microseconds",
            "jsonPath": ".spec.slice.cost.perLayerMicros",
            "priority": 1,
        },
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ),
)

CRDS = (NODE_TOPOLOGY, SLICE_RESERVATION)


def openapi_schema(model: type[BaseModel], description: str = "") -> dict[str, Any]:
    """The structural OpenAPI v3 schema of ``model`` (see the module docstring)."""
    js = model.model_json_schema(by_alias=True, mode="serialization")
    out = _convert(js, js.get("$defs", {}), "")
    if description:
        out = _ordered({**out, "description": description})
    props = out.get("properties") or {}
    if "metadata" in props:
        props["metadata"] = {"type": "object"}  # the API server's own ObjectMeta
    return out


def _resolve(node: Mapping[str, Any], defs: Mapping[str, Any], path: str) -> tuple[dict[str, Any], bool]:
    """The node with ``$ref`` inlined (the referenced class's docstring left out) and an
    ``anyOf`` with null reduced to its other branch; and whether null was allowed."""
    out = dict(node)
    if "$ref" in out:
        ref = out.pop("$ref").rsplit("/", 1)[-1]
        target = {k: v for k, v in defs[ref].items() if k != "description"}
        out = {**target, **out}
    if "anyOf" in out:
        branches = [b for b in out.pop("anyOf") if b.get("type") != "null"]
        if len(branches) != 1:
            raise SchemaGenerationError(f"{path or '(root)'}: a union of several types has no CRD form")
        inner, _ = _resolve(branches[0], defs, path)
        return {**inner, **out}, True
    return out, False


def _convert(node: Mapping[str, Any], defs: Mapping[str, Any], path: str) -> dict[str, Any]:
    node, _ = _resolve(node, defs, path)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key == "crdDefault":
            out["default"] = value
        elif key == "exclusiveMinimum":
            out["minimum"] = value
            out["exclusiveMinimum"] = True
        elif key == "properties":
            out["properties"] = {name: _convert(sub, defs, f"{path}.{name}") for name, sub in value.items()}
        elif key == "items":
            out["items"] = _convert(value, defs, f"{path}[]")
        elif key == "additionalProperties":
            if isinstance(value, Mapping):
                out["additionalProperties"] = _convert(value, defs, f"{path}{{}}")
            # true (any value) or false (unknown fields): the object's default, pruned
        elif key in _KEYS:
            out[key] = list(value) if isinstance(value, tuple) else value
        else:
            raise SchemaGenerationError(f"{path or '(root)'}: {key!r} has no place in a structural schema")
    if "type" not in out:
        raise SchemaGenerationError(f"{path or '(root)'}: no type")
    return _ordered(out)


def _ordered(node: Mapping[str, Any]) -> dict[str, Any]:
    return {k: node[k] for k in _KEYS if k in node}


def crd(spec: CrdSpec) -> dict[str, Any]:
    """The CustomResourceDefinition of one kind."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{spec.plural}.{names.GROUP}"},
        "spec": {
            "group": names.GROUP,
            "names": {
                "kind": spec.kind,
                "listKind": f"{spec.kind}List",
                "plural": spec.plural,
                "singular": spec.singular,
                "shortNames": list(spec.short_names),
            },
            "scope": spec.scope,
            "versions": [
                {
                    "name": names.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [dict(c) for c in spec.printer_columns],
                    "schema": {"openAPIV3Schema": openapi_schema(spec.model, spec.description)},
                }
            ],
        },
    }


def render(spec: CrdSpec) -> str:
    """The file text of one CRD: a comment, then the YAML."""
    header = "".join(f"# {line}\n" for line in spec.comment.splitlines())
    generated = (
        f"# Generated from extender/kube/crd_models.py ({spec.model.__name__}) by `make crds`; do not edit.\n"
    )
    body = yaml.safe_dump(crd(spec), sort_keys=False, default_flow_style=False, width=100)
    return header + generated + body


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m extender.kube.crd_schema", description=__doc__)
    parser.add_argument("--output", default="manifests/crds", help="folder of the CRD files")
    parser.add_argument("--check", action="store_true", help="exit 1 when a file is not what the models give")
    args = parser.parse_args(argv)
    out = Path(args.output)
    stale = []
    for spec in CRDS:
        path = out / spec.file_name
        text = render(spec)
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(str(path))
            continue
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if stale:
        print(
            f"{', '.join(stale)}: not what extender/kube/crd_models.py gives; run `make crds`",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
