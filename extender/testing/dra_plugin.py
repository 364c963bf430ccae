"""Fake DRA drivers' kubelet plugins, for a real kubelet: the e2e tier's DRA node.

Each speaks the kubelet's plugin registration API v1 and DRA API v1 (``proto/``) over unix
sockets as a DRA driver does, under a driver's name: NVIDIA's (``gpu.nvidia.com``) for the GPUs,
a network driver's (``dra.net``, as dranet) for the RDMA NICs. The kubelet finds each in its
``plugins_registry`` folder, and before it starts a pod calls ``NodePrepareResources`` with the
pod's ResourceClaims. A plugin reads each claim's allocation (which kube-scheduler wrote), keeps
the devices of its own driver and pool, and hands them to the container through a CDI spec it
writes, which containerd applies: for the GPUs ``NVIDIA_VISIBLE_DEVICES`` (the allocated GPUs'
UUIDs, as NVIDIA's driver's container edits make them visible); for the NICs
``GANGSLICE_TEST_NICS`` (their interface names: a real network driver moves the interfaces into
the pod instead). The ResourceSlices they would publish are
:func:`extender.testing.dra.gpu_slice` and :func:`~extender.testing.dra.nic_slice` of the same
board, which the test posts.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from extender.kube.dra import GPU_DRIVER
from extender.testing import dra_pb2 as pb
from extender.testing import dra_pb2_grpc as pb_grpc
from extender.testing import pluginregistration_pb2 as reg
from extender.testing import pluginregistration_pb2_grpc as reg_grpc
from extender.testing import unix_grpc
from extender.testing.dra import NIC_DRIVER

#: What the plugin tells the kubelet it serves (the kubelet's ``DRAPluginService``).
SERVICE = "v1.DRAPlugin"
CDI_KIND = "gangslice.test/gpu"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
NIC_CDI_KIND = "gangslice.test/nic"
#: The variable the fake network driver gives a container: its NICs' interface names.
NICS = "GANGSLICE_TEST_NICS"


@dataclass
class FakeDraDriver(pb_grpc.DRAPluginServicer):
    """Prepares the claims of one node for ``driver``: ``values`` maps its device names
    (``gpu-<i>``, ``nic<i>``) to what the container is told of each (``env``: a GPU's UUID, a
    NIC's interface name), ``claim`` reads a ResourceClaim (namespace, name) from the API server."""

    node: str
    values: Mapping[str, str]
    claim: Callable[[str, str], Mapping[str, Any] | None]
    cdi_dir: Path
    driver: str = GPU_DRIVER
    env: str = VISIBLE_DEVICES
    cdi_kind: str = CDI_KIND
    prepared: dict[str, list[str]] = field(default_factory=dict)  # claim uid -> device names

    @classmethod
    def for_nics(
        cls,
        node: str,
        names: Mapping[str, str],
        claim: Callable[[str, str], Mapping[str, Any] | None],
        cdi_dir: Path,
    ) -> FakeDraDriver:
        """The network driver's plugin: ``names`` maps device names to interface names."""
        return cls(node, names, claim, cdi_dir, NIC_DRIVER, NICS, NIC_CDI_KIND)

    def _spec_file(self, uid: str) -> Path:
        return self.cdi_dir / f"gangslice-test-{self.cdi_kind.rsplit('/', 1)[-1]}-{uid}.json"

    def _prepare(self, ref: pb.Claim) -> pb.NodePrepareResourceResponse:
        obj = self.claim(ref.namespace, ref.name)
        if obj is None or obj["metadata"]["uid"] != ref.uid:
            missing = f"claim {ref.namespace}/{ref.name} ({ref.uid}) not found"
            return pb.NodePrepareResourceResponse(error=missing)
        allocation = (obj.get("status") or {}).get("allocation") or {}
        results = [
            r
            for r in (allocation.get("devices") or {}).get("results") or ()
            if r.get("driver") == self.driver and r.get("pool") == self.node
        ]
        unknown = [r["device"] for r in results if r["device"] not in self.values]
        if not results or unknown:
            why = f"devices {unknown} are not this node's" if unknown else "no device of this driver and node"
            return pb.NodePrepareResourceResponse(error=f"claim {ref.namespace}/{ref.name}: {why}")
        visible = ",".join(self.values[r["device"]] for r in results)
        spec = {
            "cdiVersion": "0.6.0",
            "kind": self.cdi_kind,
            "devices": [{"name": ref.uid, "containerEdits": {"env": [f"{self.env}={visible}"]}}],
        }
        self._spec_file(ref.uid).write_text(json.dumps(spec))
        self.prepared[ref.uid] = [r["device"] for r in results]
        # The claim's one CDI device carries every device: named on the first one only.
        return pb.NodePrepareResourceResponse(
            devices=[
                pb.Device(
                    request_names=[r["request"]],
                    pool_name=r["pool"],
                    device_name=r["device"],
                    cdi_device_ids=[f"{self.cdi_kind}={ref.uid}"] if i == 0 else [],
                )
                for i, r in enumerate(results)
            ]
        )

    def NodePrepareResources(
        self, request: pb.NodePrepareResourcesRequest, context: Any
    ) -> pb.NodePrepareResourcesResponse:
        return pb.NodePrepareResourcesResponse(claims={c.uid: self._prepare(c) for c in request.claims})

    def NodeUnprepareResources(
        self, request: pb.NodeUnprepareResourcesRequest, context: Any
    ) -> pb.NodeUnprepareResourcesResponse:
        for c in request.claims:
            self._spec_file(c.uid).unlink(missing_ok=True)
            self.prepared.pop(c.uid, None)
        return pb.NodeUnprepareResourcesResponse(
            claims={c.uid: pb.NodeUnprepareResourceResponse() for c in request.claims}
        )


@dataclass
class Registration(reg_grpc.RegistrationServicer):
    endpoint: Path
    driver: str = GPU_DRIVER
    registered: threading.Event = field(default_factory=threading.Event)
    error: str = ""

    def GetInfo(self, request: reg.InfoRequest, context: Any) -> reg.PluginInfo:
        return reg.PluginInfo(
            type="DRAPlugin", name=self.driver, endpoint=str(self.endpoint), supported_versions=[SERVICE]
        )

    def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: Any
    ) -> reg.RegistrationStatusResponse:
        self.error = request.error
        if request.plugin_registered:
            self.registered.set()
        return reg.RegistrationStatusResponse()


@contextmanager
def serve(driver: FakeDraDriver, kubelet_root: Path, timeout: float = 60.0) -> Iterator[FakeDraDriver]:
    """Serve ``driver`` under the kubelet whose root folder is ``kubelet_root`` and wait until
    the kubelet says it registered it."""
    plugin_dir = kubelet_root / "plugins" / driver.driver
    registry = kubelet_root / "plugins_registry"
    for d in (plugin_dir, registry, driver.cdi_dir):
        d.mkdir(parents=True, exist_ok=True)
    endpoint = plugin_dir / "dra.sock"
    registration = Registration(endpoint, driver.driver)
    reg_socket = registry / f"{driver.driver}-reg.sock"
    servers = [
        unix_grpc.start(pb_grpc.add_DRAPluginServicer_to_server, driver, endpoint),
        unix_grpc.start(reg_grpc.add_RegistrationServicer_to_server, registration, reg_socket),
    ]
    try:
        if not registration.registered.wait(timeout):
            raise RuntimeError(
                f"the kubelet at {kubelet_root} did not register the {driver.driver} DRA plugin "
                f"within {timeout:.0f} s" + (f": {registration.error}" if registration.error else "")
            )
        yield driver
    finally:
        for server in servers:
            server.stop(grace=1).wait()
