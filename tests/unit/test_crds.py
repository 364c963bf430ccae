"""The gangslice CRDs: generated from the pydantic models, structural, printable, and in
agreement with the objects the code writes (the controller's and the cluster cache's)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from extender.agent.publish import build_spec
from extender.controllers.objects import reservation_from_object, reservation_to_object
from extender.controllers.openapi import SchemaError, load_crd, validate, version_schema
from extender.kube import crd_models as ct
from extender.kube import crd_schema
from extender.kube.crd_models import reservation_object
from extender.placement.files import cluster_from_data, gang_from_data
from extender.placement.ledger import Ledger, Phase
from extender.placement.slice import Slice
from extender.placement.solver import place
from extender.topology.model import FabricClique, GpuHealth
from extender.topology.presets import preset_graph
from extender.topology.serialize import graph_to_dict

CRDS = Path(__file__).resolve().parents[2] / "manifests" / "crds"
#: NodeTopology spec fields the node agent adds to graph_to_dict's.
AGENT_FIELDS = {"devicesInUse", "allocatableDevices", "source", "allocation"}


def _crd(plural: str) -> dict[str, Any]:
    return load_crd(CRDS / f"gangslice.io_{plural}.yaml")


def _schema(plural: str) -> dict[str, Any]:
    return version_schema(_crd(plural), "v1alpha1")


# -- the CRDs themselves -----------------------------------------------------------------------


@pytest.mark.parametrize("spec", crd_schema.CRDS, ids=lambda s: s.plural)
def test_the_crd_files_are_what_the_models_generate(spec: crd_schema.CrdSpec) -> None:
    on_disk = (CRDS / spec.file_name).read_text()
    assert on_disk == crd_schema.render(spec), (
        f"manifests/crds/{spec.file_name} is not what extender/kube/crd_models.py generates; run `make crds`"
    )


def test_check_mode_names_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert crd_schema.main(["--output", str(tmp_path)]) == 0
    assert crd_schema.main(["--output", str(tmp_path), "--check"]) == 0
    stale = tmp_path / crd_schema.NODE_TOPOLOGY.file_name
    stale.write_text(stale.read_text().replace("minimum: -1", "minimum: -2"))
    assert crd_schema.main(["--output", str(tmp_path), "--check"]) == 1
    assert "run `make crds`" in capsys.readouterr().err


def test_the_generator_refuses_what_a_structural_schema_cannot_say() -> None:
    class Either(BaseModel):
        value: int | str

    with pytest.raises(crd_schema.SchemaGenerationError, match="value"):
        crd_schema.openapi_schema(Either)


@pytest.mark.parametrize("field", ["nvlinkGbps", "pcieGbps"])
@pytest.mark.parametrize("value", [0, -1.0])
def test_a_bandwidth_of_zero_is_refused_by_the_crd_and_the_model(field: str, value: float) -> None:
    """The cost model divides by both bandwidths: 0 is refused on write (the CRD) and on read
    (the model the cluster cache reads with), naming the field."""
    obj = _node_topology()
    obj["spec"][field] = value
    with pytest.raises(SchemaError, match=f"spec.{field}"):
        validate(_schema("nodetopologies"), obj)
    with pytest.raises(ValidationError, match=field):
        ct.NodeTopologySpec.model_validate(obj["spec"])
    with pytest.raises(ct.CrdError, match=f"spec.{field}: Input should be greater than 0") as err:
        ct.parse_node_topology(obj)
    assert err.value.field == f"spec.{field}"
    obj["spec"][field] = 0.5
    validate(_schema("nodetopologies"), obj)
    assert ct.parse_node_topology(obj).graph is not None


@pytest.mark.parametrize(
    ("plural", "kind", "scope", "columns"),
    [
        ("nodetopologies", "NodeTopology", "Cluster", {"GPUs", "Source", "Age"}),
        ("slicereservations", "SliceReservation", "Namespaced", {"Phase", "Nodes", "GPUs", "Age"}),
    ],
)
def test_crd_identity_columns_and_status(plural: str, kind: str, scope: str, columns: set[str]) -> None:
    crd = _crd(plural)
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["metadata"]["name"] == f"{plural}.gangslice.io"
    assert crd["spec"]["group"] == "gangslice.io"
    assert crd["spec"]["names"]["kind"] == kind
    assert crd["spec"]["names"]["plural"] == plural
    assert crd["spec"]["scope"] == scope
    (version,) = crd["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    printed = {c["name"] for c in version["additionalPrinterColumns"]}
    assert columns <= printed
    for c in version["additionalPrinterColumns"]:
        assert c["type"] in {"string", "integer", "number", "boolean", "date"}
        assert c["jsonPath"].startswith(".")


def _walk(node: Any, path: str, out: list[tuple[str, dict[str, Any]]]) -> None:
    if not isinstance(node, dict):
        return
    out.append((path, node))
    for name, sub in (node.get("properties") or {}).items():
        _walk(sub, f"{path}.{name}", out)
    if isinstance(node.get("items"), dict):
        _walk(node["items"], f"{path}[]", out)
    if isinstance(node.get("additionalProperties"), dict):
        _walk(node["additionalProperties"], f"{path}{{}}", out)


@pytest.mark.parametrize("plural", ["nodetopologies", "slicereservations"])
def test_schema_is_structural(plural: str) -> None:
    """Every node has a type; list-map keys are required scalars; required names exist."""
    nodes: list[tuple[str, dict[str, Any]]] = []
    _walk(_schema(plural), "", nodes)
    assert len(nodes) > 20
    for path, node in nodes:
        assert "type" in node, f"{plural}{path}: no type"
        for req in node.get("required") or ():
            assert req in node["properties"], f"{plural}{path}: required {req} is not a property"
        if node.get("x-kubernetes-list-type") == "map":
            keys = node["x-kubernetes-list-map-keys"]
            assert set(keys) <= set(node["items"].get("required") or ()), (
                f"{plural}{path}: map keys not required"
            )
            for k in keys:
                assert node["items"]["properties"][k]["type"] in {"string", "integer"}


def test_printer_columns_point_at_schema_fields() -> None:
    for plural in ("nodetopologies", "slicereservations"):
        (version,) = _crd(plural)["spec"]["versions"]
        schema = version["schema"]["openAPIV3Schema"]
        for c in version["additionalPrinterColumns"]:
            node: Any = schema
            for part in c["jsonPath"].lstrip(".").split("."):
                if part == "metadata":
                    node = None
                    break
                node = node["properties"][part]
            if node is not None:
                assert node["type"] in {"string", "integer", "number", "array"}, c


# -- pydantic models and CRD schemas agree -----------------------------------------------------


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """(schema without $ref and null branch, nullable)."""
    nullable = False
    if "$ref" in node:
        node = defs[node["$ref"].rsplit("/", 1)[-1]]
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        nullable = len(branches) < len(node["anyOf"])
        assert len(branches) == 1, node
        inner, _ = _resolve(branches[0], defs)
        node = {**inner, **{k: v for k, v in node.items() if k not in ("anyOf", "default", "title")}}
    return node, nullable


def _compare(
    model: dict[str, Any], crd: dict[str, Any], path: str, defs: dict[str, Any], out: list[str]
) -> None:
    model, _ = _resolve(model, defs)
    mtype, ctype = model.get("type"), crd.get("type")
    if mtype != ctype:
        out.append(f"{path}: model type {mtype} != schema type {ctype}")
        return
    for key in ("minimum", "pattern", "minLength", "format"):
        if key in model or key in crd:
            want = model.get(key, model.get("exclusiveMinimum") if key == "minimum" else None)
            if want != crd.get(key):
                out.append(f"{path}: {key} model {want!r} != schema {crd.get(key)!r}")
    if set(model.get("enum") or ()) != set(crd.get("enum") or ()):
        out.append(f"{path}: enum model {model.get('enum')} != schema {crd.get('enum')}")
    if mtype == "array":
        _compare(model["items"], crd["items"], f"{path}[]", defs, out)
    if mtype == "object":
        mprops, cprops = model.get("properties") or {}, crd.get("properties") or {}
        for name in sorted(set(mprops) | set(cprops)):
            if name not in cprops:
                out.append(f"{path}.{name}: in the model, not in the schema")
            elif name not in mprops:
                out.append(f"{path}.{name}: in the schema, not in the model")
            else:
                _compare(mprops[name], cprops[name], f"{path}.{name}", defs, out)
        if set(model.get("required") or ()) != set(crd.get("required") or ()):
            out.append(f"{path}: required model {model.get('required')} != schema {crd.get('required')}")
        madd, cadd = model.get("additionalProperties"), crd.get("additionalProperties")
        if isinstance(madd, dict) or isinstance(cadd, dict):
            if not (isinstance(madd, dict) and isinstance(cadd, dict)):
                out.append(f"{path}: additionalProperties model {madd!r} != schema {cadd!r}")
            else:
                _compare(madd, cadd, f"{path}{{}}", defs, out)


@pytest.mark.parametrize(
    ("plural", "part", "model"),
    [
        ("nodetopologies", "spec", ct.NodeTopologySpec),
        ("nodetopologies", "status", ct.NodeTopologyStatus),
        ("slicereservations", "spec", ct.SliceReservationSpec),
        ("slicereservations", "status", ct.SliceReservationStatus),
    ],
)
def test_model_and_schema_agree(plural: str, part: str, model: type[BaseModel]) -> None:
    js = model.model_json_schema(by_alias=True)
    problems: list[str] = []
    _compare(js, _schema(plural)["properties"][part], f"{plural}.{part}", js.get("$defs", {}), problems)
    assert problems == []


def test_comparison_catches_a_drift() -> None:
    """The agreement check itself fails on a field the schema lacks and on a required drift."""

    class Drifted(BaseModel):
        gang: str
        extra: int

    js = Drifted.model_json_schema(by_alias=True)
    problems: list[str] = []
    _compare(js, _schema("slicereservations")["properties"]["spec"], "spec", {}, problems)
    assert any("extra: in the model" in p for p in problems)
    assert any("required" in p for p in problems)


# -- sample objects ----------------------------------------------------------------------------


def _node_topology() -> dict[str, Any]:
    graph = preset_graph("hgx-h100")
    graph = type(graph)(
        gpus=graph.gpus,
        links=graph.links,
        nics=graph.nics,
        clique=FabricClique("c0ffee00-0000-4000-8000-000000000001", 3),
        health={2: GpuHealth(nvlink_errors_per_s=4.0, healthy=False, reason="NVLink errors")},
        nvlink_gbps=graph.nvlink_gbps,
        pcie_gbps=graph.pcie_gbps,
        model=graph.model,
    )
    in_use = [
        {"deviceId": "GPU-0", "index": 0, "namespace": "serving", "pod": "vllm-0", "container": "server"}
    ]
    spec = build_spec(graph, "nvml", in_use, [f"GPU-{i}" for i in range(8)])
    status = {
        "conditions": [{"type": "Published", "status": "True", "lastTransitionTime": "2026-08-25T10:00:00Z"}],
        "lastPublished": "2026-08-25T10:00:00Z",
    }
    obj = {"apiVersion": "gangslice.io/v1alpha1", "kind": "NodeTopology", "metadata": {"name": "gpu-a-01"}}
    return ct.NodeTopologyObject.model_validate({**obj, "spec": spec, "status": status}).to_dict()


def test_node_topology_sample_validates_and_round_trips() -> None:
    obj = _node_topology()
    validate(_schema("nodetopologies"), obj, "NodeTopology")
    assert obj["spec"]["source"] == "nvml"
    ct.NodeTopologySpec.model_validate(obj["spec"])
    graph = ct.NodeTopologySpec.model_validate(obj["spec"]).to_graph()
    assert graph_to_dict(graph) == {k: v for k, v in obj["spec"].items() if k not in AGENT_FIELDS}
    assert not graph.healthy(2)


def test_graph_to_dict_is_exactly_the_spec_without_the_agent_fields() -> None:
    """The contract: spec = graph_to_dict(graph) plus the three agent fields, nothing renamed."""
    graph = preset_graph("pcie-8gpu-2socket")
    spec = ct.NodeTopologySpec.model_validate(build_spec(graph, "nvidia-smi", [], [])).to_dict()
    assert {k: v for k, v in spec.items() if k not in AGENT_FIELDS} == graph_to_dict(graph)
    validate(
        _schema("nodetopologies"),
        {"apiVersion": "gangslice.io/v1alpha1", "kind": "NodeTopology", "spec": spec},
    )


def test_the_node_agents_object_validates() -> None:
    """What the node agent publishes (spec and status) is kept whole by the CRD."""
    from datetime import UTC, datetime

    from extender.agent.publish import build_object, build_spec

    graph = preset_graph("hgx-h100")
    in_use = [{"deviceId": "MIG-1", "namespace": "a", "pod": "p", "container": "c"}]
    spec = build_spec(graph, "nvml", in_use, ["GPU-1", "MIG-1"])
    cond = {
        "type": "Discovered",
        "status": "True",
        "reason": "Nvml",
        "message": "8 GPUs",
        "lastTransitionTime": "2026-08-25T10:00:00Z",
    }
    obj = build_object("gpu-a-01", spec, [cond], datetime(2026, 8, 25, 10, 0, tzinfo=UTC), node_uid="u-1")
    obj["status"]["observedGeneration"] = 3
    validate(_schema("nodetopologies"), obj, "agent NodeTopology")
    ct.NodeTopologyObject.model_validate(obj)


def _reservation() -> tuple[Any, Slice]:
    snap = cluster_from_data(
        {
            "levels": ["fabric.topograph.run/tier-0"],
            "nodes": [
                {
                    "name": "a",
                    "count": 2,
                    "labels": {"fabric.topograph.run/tier-0": "leaf-a"},
                    "gpuTopology": "hgx-h100",
                }
            ],
        },
        Path("."),
    )
    gang = gang_from_data(
        {
            "name": "serving/vllm",
            "podSets": [{"name": "worker", "count": 2, "gpusPerPod": 4, "comm": "allreduce"}],
        }
    )
    sl = place(snap, gang)
    assert isinstance(sl, Slice)
    ledger = Ledger()
    r = ledger.reserve(
        sl, 1_756_116_000.25, {"ownerKind": "Workload", "ownerName": "vllm", "ownerUid": "u-1"}
    )
    r = ledger.bind("serving/vllm", "worker/0", "vllm-0", 1_756_116_001.0)
    return r, sl


def test_reservation_object_validates_and_round_trips() -> None:
    r, _ = _reservation()
    owner = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "name": "vllm",
        "uid": "u-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    obj = reservation_to_object(r, "serving", "vllm", owner, now=1_756_116_002.0)
    validate(_schema("slicereservations"), obj, "SliceReservation")
    ct.SliceReservationObject.model_validate(obj)
    assert obj["metadata"]["ownerReferences"] == [owner]
    assert obj["status"]["nodes"] == ",".join(r.slice.nodes)
    assert obj["status"]["gpus"] == 8
    assert obj["status"]["boundPods"] == {"worker/0": "vllm-0"}
    back = reservation_from_object(obj)
    assert back.gang == r.gang
    assert back.slice.to_dict() == r.slice.to_dict()
    assert back.expires_at == r.expires_at
    assert back.bound == r.bound and back.phase == r.phase
    assert back.meta == {**r.meta, "namespace": "serving", "name": "vllm"}


def test_the_cluster_caches_reservation_object_validates_too() -> None:
    """Both writers of SliceReservations produce what the CRD keeps (nothing is pruned)."""
    r, _ = _reservation()
    obj = reservation_object(r)
    validate(_schema("slicereservations"), obj)
    dumped = ct.SliceReservationSpec.model_validate(obj["spec"]).model_dump(by_alias=True, mode="json")
    assert dumped == obj["spec"]


def _reservation_object() -> dict[str, Any]:
    r, _ = _reservation()
    return reservation_to_object(r, "serving", "vllm", None, now=1.0)


@pytest.mark.parametrize(
    ("plural", "sample", "model", "path", "value"),
    [
        *(
            ("nodetopologies", _node_topology, ct.NodeTopologyObject, path, value)
            for path, value in [
                (("spec", "source"), "dcgm"),
                (("spec", "links", 0, "link"), "NVLINK"),
                (("spec", "gpus", 0, "index"), -1),
                (("spec", "nics", 0, "gpuLinks", "0"), "QPI"),
                (("status", "conditions", 0, "status"), "Yes"),
                (("status", "lastPublished"), "yesterday"),
            ]
        ),
        *(
            ("slicereservations", _reservation_object, ct.SliceReservationObject, path, value)
            for path, value in [
                (("spec", "phase"), "Held"),
                (("spec", "expiresAt"), "2026-08-25T10:00:00Z"),
                (("spec", "slice", "pods", 0, "gpus", 0), -3),
                (("status", "gpus"), -1),
            ]
        ),
    ],
)
def test_schema_and_model_reject(
    plural: str,
    sample: Callable[[], dict[str, Any]],
    model: type[BaseModel],
    path: tuple[Any, ...],
    value: Any,
) -> None:
    obj = sample()
    node: Any = obj
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    with pytest.raises(SchemaError):
        validate(_schema(plural), obj)
    with pytest.raises(ValidationError):
        model.model_validate(obj)


def test_reservation_without_required_fields_is_rejected() -> None:
    obj = _reservation_object()
    del obj["spec"]["gang"]
    with pytest.raises(SchemaError, match="gang"):
        validate(_schema("slicereservations"), obj)
    obj = _reservation_object()
    obj["spec"]["phase"] = Phase.EXPIRED.value
    validate(_schema("slicereservations"), obj)
