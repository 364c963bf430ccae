"""The e2e tier's fake GPU DRA driver without a kubelet: what it prepares from a claim's
allocation (its own driver and pool only), the CDI spec it writes, its refusals, and what it
tells the kubelet at registration."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from extender.testing import dra_pb2 as pb
from extender.testing import pluginregistration_pb2 as reg
from extender.testing.dra_plugin import CDI_KIND, NIC_CDI_KIND, NICS, SERVICE, FakeDraDriver, Registration

UUIDS = {"gpu-0": "GPU-a", "gpu-1": "GPU-b", "gpu-2": "GPU-c"}


def _claim(results: list[dict[str, str]], uid: str = "u1") -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "name": "c", "namespace": "ns"},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def _result(device: str, driver: str = "gpu.nvidia.com", pool: str = "n0") -> dict[str, str]:
    return {"request": "gpu", "driver": driver, "pool": pool, "device": device}


def _prepare(driver: FakeDraDriver, uid: str = "u1") -> pb.NodePrepareResourceResponse:
    request = pb.NodePrepareResourcesRequest(claims=[pb.Claim(namespace="ns", name="c", uid=uid)])
    return driver.NodePrepareResources(request, None).claims[uid]


def test_a_claim_is_prepared_into_one_cdi_device_with_its_gpus(tmp_path: Path) -> None:
    claim = _claim([_result("gpu-2"), _result("gpu-0"), _result("gpu-1", pool="other-node")])
    driver = FakeDraDriver("n0", UUIDS, lambda ns, name: claim, tmp_path)
    got = _prepare(driver)
    assert not got.error
    assert [(d.device_name, list(d.request_names), list(d.cdi_device_ids)) for d in got.devices] == [
        ("gpu-2", ["gpu"], [f"{CDI_KIND}=u1"]),
        ("gpu-0", ["gpu"], []),
    ]
    spec = json.loads((tmp_path / "gangslice-test-gpu-u1.json").read_text())
    assert spec["kind"] == CDI_KIND
    assert spec["devices"] == [
        {"name": "u1", "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=GPU-c,GPU-a"]}}
    ]
    assert driver.prepared == {"u1": ["gpu-2", "gpu-0"]}
    done = driver.NodeUnprepareResources(
        pb.NodeUnprepareResourcesRequest(claims=[pb.Claim(namespace="ns", name="c", uid="u1")]), None
    )
    assert not done.claims["u1"].error
    assert not (tmp_path / "gangslice-test-gpu-u1.json").exists() and driver.prepared == {}


def test_claims_it_cannot_prepare_are_refused_naming_why(tmp_path: Path) -> None:
    gone = FakeDraDriver("n0", UUIDS, lambda ns, name: None, tmp_path)
    assert "not found" in _prepare(gone).error
    replaced = FakeDraDriver("n0", UUIDS, lambda ns, name: _claim([_result("gpu-0")], uid="other"), tmp_path)
    assert "not found" in _prepare(replaced).error
    foreign = FakeDraDriver("n0", UUIDS, lambda ns, name: _claim([_result("gpu-0", driver="x")]), tmp_path)
    assert "no device of this driver and node" in _prepare(foreign).error
    unknown = FakeDraDriver("n0", UUIDS, lambda ns, name: _claim([_result("gpu-9")]), tmp_path)
    assert "gpu-9" in _prepare(unknown).error
    assert not list(tmp_path.iterdir())


def test_registration_names_the_driver_its_socket_and_the_dra_service(tmp_path: Path) -> None:
    registration = Registration(tmp_path / "dra.sock")
    info = registration.GetInfo(reg.InfoRequest(), None)
    assert (info.type, info.name, info.endpoint) == (
        "DRAPlugin",
        "gpu.nvidia.com",
        str(tmp_path / "dra.sock"),
    )
    assert list(info.supported_versions) == [SERVICE] == ["v1.DRAPlugin"]
    registration.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=False, error="no"), None)
    assert not registration.registered.is_set() and registration.error == "no"
    registration.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True), None)
    assert registration.registered.is_set()


# The field tables of k8s.io/kubelet pkg/apis/dra/v1 and pluginregistration/v1 api.proto:
# message -> [(field, number, repeated)]; and their packages, whose names are in the method paths.
DRA_FIELDS = {
    "NodePrepareResourcesRequest": [("claims", 1, True)],
    "NodePrepareResourcesResponse": [("claims", 1, True)],
    "NodePrepareResourceResponse": [("devices", 1, True), ("error", 2, False)],
    "Device": [
        ("request_names", 1, True),
        ("pool_name", 2, False),
        ("device_name", 3, False),
        ("cdi_device_ids", 4, True),
        ("share_id", 5, False),
    ],
    "NodeUnprepareResourcesRequest": [("claims", 1, True)],
    "NodeUnprepareResourcesResponse": [("claims", 1, True)],
    "NodeUnprepareResourceResponse": [("error", 1, False)],
    "Claim": [("namespace", 1, False), ("uid", 2, False), ("name", 3, False)],
}
REGISTRATION_FIELDS = {
    "PluginInfo": [
        ("type", 1, False),
        ("name", 2, False),
        ("endpoint", 3, False),
        ("supported_versions", 4, True),
    ],
    "RegistrationStatus": [("plugin_registered", 1, False), ("error", 2, False)],
    "RegistrationStatusResponse": [],
    "InfoRequest": [],
}


def test_the_dra_and_registration_wires_are_the_kubelets() -> None:
    for module, table in ((pb, DRA_FIELDS), (reg, REGISTRATION_FIELDS)):
        for message, fields in table.items():
            got = [
                (f.name, f.number, f.is_repeated)
                for f in module.DESCRIPTOR.message_types_by_name[message].fields
            ]
            assert got == fields, message
    assert pb.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1"
    assert reg.DESCRIPTOR.package == "pluginregistration"
    assert pb.DESCRIPTOR.message_types_by_name["Device"].fields_by_name["share_id"].has_presence
    services = {
        name: [m.name for m in s.methods]
        for module in (pb, reg)
        for name, s in module.DESCRIPTOR.services_by_name.items()
    }
    assert services == {
        "DRAPlugin": ["NodePrepareResources", "NodeUnprepareResources"],
        "Registration": ["GetInfo", "NotifyRegistrationStatus"],
    }


def test_the_network_driver_prepares_its_nics_only_and_registers_under_its_name(tmp_path: Path) -> None:
    claim = _claim([_result("gpu-1"), _result("nic1", driver="dra.net")])
    nics = FakeDraDriver.for_nics(
        "n0", {"nic0": "mlx5_0", "nic1": "mlx5_1"}, lambda ns, name: claim, tmp_path
    )
    got = _prepare(nics)
    assert [(d.device_name, list(d.cdi_device_ids)) for d in got.devices] == [
        ("nic1", [f"{NIC_CDI_KIND}=u1"])
    ]
    spec = json.loads((tmp_path / "gangslice-test-nic-u1.json").read_text())
    assert spec["devices"] == [{"name": "u1", "containerEdits": {"env": [f"{NICS}=mlx5_1"]}}]
    info = Registration(tmp_path / "dra.sock", nics.driver).GetInfo(reg.InfoRequest(), None)
    assert info.name == "dra.net"
