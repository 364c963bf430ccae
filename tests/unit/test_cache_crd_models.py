"""NodeTopology and SliceReservation objects: read as the cache needs them, refused when broken."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from extender.agent.publish import build_object, build_spec
from extender.kube.crd_models import (
    CrdError,
    object_name,
    parse_node_topology,
    reservation_from_object,
)
from extender.kube.pods import PodError, PodInfo, parse_gpu_list, quantity
from extender.testing.extender import gang_pod, pod_obj
from extender.topology.presets import PRESETS, preset_graph
from extender.topology.serialize import graph_to_dict


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_node_topology_round_trips_every_preset(preset: str) -> None:
    graph = preset_graph(preset)
    published = datetime(2026, 1, 1, tzinfo=UTC)
    topo = parse_node_topology(build_object("n1", build_spec(graph, "nvml", [], []), [], published))
    assert topo.node == "n1"
    assert topo.graph == graph


def test_the_agent_spec_shape_reads_back() -> None:
    graph = preset_graph("pcie-8gpu-2socket")
    spec = {
        **graph_to_dict(graph),
        "devicesInUse": [{"deviceId": "GPU-a", "index": 3, "namespace": "ns", "pod": "p", "container": "c"}],
        "allocatableDevices": ["GPU-a"],
        "source": "nvml",
    }
    topo = parse_node_topology({"metadata": {"name": "n1"}, "spec": spec})
    assert topo.graph == graph
    assert topo.in_use == {"ns/p": frozenset({3})}


def test_source_none_means_no_graph() -> None:
    topo = parse_node_topology(
        {"metadata": {"name": "n1"}, "spec": {"gpus": [], "links": [], "source": "none"}}
    )
    assert topo.graph is None


@pytest.mark.parametrize(
    ("obj", "words"),
    [
        ({"spec": {}}, "metadata.name"),
        ({"metadata": {"name": "n1"}}, "no spec"),
        ({"metadata": {"name": "n1"}, "spec": {"gpus": [{"index": -1}]}}, "spec.gpus.0.index"),
        (
            {
                "metadata": {"name": "n1"},
                "spec": {"gpus": [{"index": 0}, {"index": 1}], "links": [], "source": "nvml"},
            },
            "no link given",
        ),
        (
            {
                "metadata": {"name": "n1"},
                "spec": {"gpus": [{"index": 0}, {"index": 1}], "links": [{"a": 0, "b": 1, "link": "XYZ"}]},
            },
            "spec.links.0.link: String should match pattern",
        ),
        (
            {"metadata": {"name": "n1"}, "spec": {"gpus": [{"index": 0}], "links": []}},
            "spec.source: Field required",
        ),
    ],
)
def test_broken_node_topologies_are_refused_with_the_field_named(obj: dict[str, Any], words: str) -> None:
    with pytest.raises(CrdError, match=words):
        parse_node_topology(obj)


@pytest.mark.parametrize(
    ("gang", "name"),
    [("llm/llama-70b", "llama-70b"), ("llm/Big_Gang!", "big-gang"), ("nons", "nons"), ("ns/---", "gang")],
)
def test_object_names_are_dns_subdomains(gang: str, name: str) -> None:
    assert object_name(gang) == name


def test_a_slice_reservation_without_a_reservation_in_its_spec_is_refused() -> None:
    with pytest.raises(CrdError, match="SliceReservation llm/x"):
        reservation_from_object({"metadata": {"namespace": "llm", "name": "x"}, "spec": {"gang": "llm/x"}})


def test_a_slice_reservation_for_another_namespaces_gang_is_refused() -> None:
    from extender.kube.crd_models import reservation_object
    from extender.placement.ledger import Reservation
    from extender.placement.slice import Slice

    held = reservation_object(Reservation("other/g", Slice("other/g", (), {}), 0.0))
    assert reservation_from_object(held).gang == "other/g"
    held["metadata"]["namespace"] = "mine"
    with pytest.raises(
        CrdError, match=r"spec\.gang 'other/g' is a gang of namespace 'other', not of the object's own"
    ):
        reservation_from_object(held)


def test_pod_info_reads_what_gangslice_needs() -> None:
    obj = gang_pod("g-0", "g", 4, 8, extra={"gangslice.io/required-level": "leaf"})
    obj["spec"]["initContainers"] = [{"name": "init", "resources": {"limits": {"nvidia.com/gpu": 9}}}]
    pod = PodInfo.from_obj(obj)
    assert (pod.key, pod.gang, pod.gang_size, pod.gpus) == ("llm/g-0", "llm/g", 4, 9)
    assert pod.required_level == "leaf" and pod.preferred_level is None


def test_pod_info_survives_garbage() -> None:
    pod = PodInfo.from_obj({"metadata": [], "spec": {"containers": "x"}, "status": 7})
    assert (pod.name, pod.namespace, pod.gpus) == ("", "default", 0)
    bad = PodInfo.from_obj(pod_obj("x", annotations={"gangslice.io/gang-size": "many"}))
    with pytest.raises(PodError, match="gang-size"):
        _ = bad.gang_size
    odd = pod_obj("y")
    odd["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1.5"}}
    assert PodInfo.from_obj(odd).problems


@pytest.mark.parametrize(
    ("raw", "want"), [("0,1,2,3", (0, 1, 2, 3)), ("7", (7,)), ("0,0", None), ("a", None)]
)
def test_gpu_annotation_parsing(raw: str, want: tuple[int, ...] | None) -> None:
    assert parse_gpu_list(raw) == want


@pytest.mark.parametrize(("value", "want"), [(8, 8), ("8", 8), ("8000m", 8), (2.0, 2)])
def test_quantities(value: object, want: int) -> None:
    assert quantity(value) == want


@pytest.mark.parametrize("value", [-1, "-1", "1.5", True, None, "1Ki"])
def test_bad_quantities(value: object) -> None:
    with pytest.raises(PodError):
        quantity(value)
