"""A real node for the e2e tier: kubelet, containerd and runc built from their Go modules
(hack/e2e/build.sh), a CNI bridge, and NVIDIA's allocation answers from a fake-GPU device plugin.

What it takes to run one on a VM with cgroup v1 hierarchies and no registry:

- **cgroup v1:** the kubelet refuses v1 unless ``failCgroupV1: false``; ``cgroupfs`` driver.
- **No CAP_SYS_RESOURCE** (this VM's root lacks it): no process may lower its
  ``oom_score_adj``, and runc fails every pod sandbox (``-998``) and Guaranteed container
  (``-997``) with "failed to update /proc/self/oom_score_adj: Permission denied". containerd's
  ``restrict_oom_score_adj`` clamps them to its own score.
- **No registry:** the sandbox image is ``tools/pause`` packed into an OCI archive here, the
  workload image is the project's (``hack/image/build.sh``); both are imported with ``ctr``.
- **Two NUMA nodes on a machine with one:** the kubelet runs in a mount namespace of its own
  where ``/sys/devices/system/node`` is a tree written here that splits the machine's CPUs in
  two (cadvisor reads NUMA nodes, their CPUs and memory from it), so its CPU manager and
  Topology Manager see the sockets of the fake GPU board. The kubelet's root folder is a shared
  mount, so the volumes it mounts from that namespace (downward API, projected: tmpfs) reach
  containerd. Its device-plugin folder (``/var/lib/kubelet/device-plugins``) is fixed in the
  kubelet and so the machine's: one real node runs on a machine at a time.
- The kubelet writes its usual kernel tunables (``vm/overcommit_memory``, ``kernel/panic``...),
  as on any node.
"""

from __future__ import annotations

import json
import os
import shutil
import socket as sockets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster import (
    SYSTEM_NS,
    create,
    delete,
    get,
    gpu_pod,
    items,
    pod_token_kubeconfig,
    wait_for,
    wait_for_or_false,
)
from oci import pack

from extender.agent.fakes import FAKES, fake_node
from extender.bench.controlplane import ControlPlane, free_ports
from extender.kube import dra
from extender.testing import device_plugin, dra_plugin, gpuallocator
from extender.testing.dra import NIC_DRIVER, gpu_slice, nic_slice
from extender.topology.nvml import discover
from extender.topology.serialize import parse_cpu_ranges

REPO = Path(__file__).resolve().parents[2]
PAUSE_IMAGE = "gangslice.test/pause:1"
IMAGE = "ghcr.io/gangslice/gangslice:0.1.0"  # the project's image, as hack/image/build.sh names it
HOST_SYS = "/host/sys"  # where a workload pod sees the node's NUMA tree
DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")
NODE_SYSFS = Path("/sys/devices/system/node")


def write_numa_sysfs(root: Path, nodes: int = 2) -> dict[int, list[int]]:
    """``<root>/devices/system/node``: the machine's online CPUs and memory split into ``nodes``
    NUMA nodes, as cadvisor and gangslice's agent read them. Returns node -> CPUs."""
    cpus = sorted(parse_cpu_ranges(Path("/sys/devices/system/cpu/online").read_text().strip()))
    if len(cpus) < nodes:
        raise RuntimeError(
            f"the real node needs at least {nodes} CPUs (one per NUMA node); this machine has {cpus}"
        )
    mem_kb = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    base = root / "devices" / "system" / "node"
    split = {n: cpus[n * len(cpus) // nodes : (n + 1) * len(cpus) // nodes] for n in range(nodes)}
    for n, mine in split.items():
        d = base / f"node{n}"
        (d / "hugepages" / "hugepages-2048kB").mkdir(parents=True)
        for f in ("nr_hugepages", "free_hugepages", "surplus_hugepages"):
            (d / "hugepages" / "hugepages-2048kB" / f).write_text("0\n")
        (d / "cpulist").write_text(",".join(map(str, mine)) + "\n")
        for cpu in mine:
            (d / f"cpu{cpu}").symlink_to(f"/sys/devices/system/cpu/cpu{cpu}")
        share = mem_kb // nodes
        (d / "meminfo").write_text(
            f"Node {n} MemTotal:       {share} kB\nNode {n} MemFree:        {share // 2} kB\n"
            f"Node {n} MemUsed:        {share - share // 2} kB\n"
        )
        (d / "distance").write_text(" ".join("10" if m == n else "20" for m in range(nodes)) + "\n")
    every = f"0-{nodes - 1}\n"
    for f in ("online", "possible", "has_cpu", "has_memory", "has_normal_memory"):
        (base / f).write_text(every)
    return split


def build_workload_image() -> Path:
    """The project's image (hack/image/build.sh; its Debian and dependency steps are cached)."""
    proc = subprocess.run(
        ["bash", str(REPO / "hack" / "image" / "build.sh"), "amd64"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"hack/image/build.sh failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return Path(proc.stdout.strip().splitlines()[-1].split("=", 1)[1])


@dataclass
class RealNode:
    """One node: containerd, a kubelet registered as ``name`` and the GPUs of the fake board
    ``preset``, handed out by the fake-GPU device plugin (``allocation="devicePlugin"``) or by
    the fake GPU DRA driver (``"dra"``, its ResourceSlice posted as NVIDIA's driver publishes it,
    beside a fake network driver's for the board's RDMA NICs). Start with :meth:`running`."""

    cp: ControlPlane
    name: str
    labels: Mapping[str, str]
    images: tuple[Path, ...] = ()
    preset: str = "hgx-h100"
    allocation: str = "devicePlugin"
    workdir: Path = field(init=False)
    plugin: device_plugin.FakeGpuPlugin = field(init=False)
    driver: dra_plugin.FakeDraDriver = field(init=False)
    nics: dra_plugin.FakeDraDriver = field(init=False)
    slices: list[dict[str, Any]] = field(init=False)  # the DRA drivers' ResourceSlices

    @property
    def bin_dir(self) -> Path:
        return self.cp.bin_dir

    @property
    def containerd_socket(self) -> Path:
        return self.workdir / "containerd.sock"

    @property
    def pod_resources_socket(self) -> Path:
        return self.workdir / "kubelet" / "pod-resources" / "kubelet.sock"

    @property
    def kubelet_config_file(self) -> Path:
        return self.workdir / "kubelet.yaml"

    @property
    def pod_logs(self) -> Path:
        return self.workdir / "pod-logs"

    @property
    def sysfs(self) -> Path:
        return self.workdir / "sys"

    @contextmanager
    def running(self, oracle: Path | None = None) -> Iterator[RealNode]:
        if os.geteuid() != 0:
            raise RuntimeError(
                "the real node needs root: the kubelet and containerd mount, make cgroups and run "
                "containers, and the kubelet runs in a mount namespace of its own (unshare)"
            )
        for tool in ("unshare", "mount", "umount", "ip", "pkill"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"the real node needs {tool!r} on PATH (util-linux, iproute2, procps)")
        # Unix socket paths are limited to 107 bytes: a short folder of its own.
        self.workdir = Path(tempfile.mkdtemp(prefix="gsn-"))
        with ExitStack() as stack:
            stack.callback(self._clean)
            self.numa = write_numa_sysfs(self.sysfs)
            self._start_containerd()
            stack.callback(self.cp.stop_process, f"containerd-{self.name}")
            self._import(pack_pause(self.bin_dir / "pause", self.workdir / "pause.tar"), *self.images)
            self._start_kubelet()
            stack.callback(self._stop_pods)
            wait_for(f"node {self.name} Ready", self._ready, 90)
            if self.allocation == "dra":
                stack.enter_context(self._dra_driver())
            else:
                assert oracle is not None, "the device plugin answers with go-gpuallocator: build the oracle"
                self.plugin = device_plugin.FakeGpuPlugin(FAKES[self.preset](), oracle)
                stack.enter_context(device_plugin.serve(self.plugin, DEVICE_PLUGINS))
                wait_for(f"{self.name} advertising its GPUs", self._gpus_advertised, 60)
            yield self

    @contextmanager
    def _dra_driver(self) -> Iterator[None]:
        """The DRA drivers' kubelet plugins registered (the GPUs' and the RDMA NICs'), and their
        ResourceSlices for this node's board."""
        with fake_node(self.preset, machine=self.sysfs) as (fake, sysfs):
            graph = discover(fake, sysfs_root=sysfs)
        node = get(self.cp, "Node", self.name)
        assert node is not None
        nics = nic_slice(self.name, graph)
        # Socket 1's NICs listed first: only a constraint puts socket 0's GPUs beside socket 0's NIC.
        nics["spec"]["devices"].sort(key=lambda d: -d["attributes"][f"{NIC_DRIVER}/numaNode"]["int"])
        self.slices = [gpu_slice(self.name, graph, uid=node["metadata"]["uid"]), nics]
        for obj in self.slices:
            self.cp.request("POST", "/apis/resource.k8s.io/v1/resourceslices", obj)

        def claim(namespace: str, name: str) -> dict[str, Any] | None:
            return get(self.cp, "ResourceClaim", name, namespace)

        uuids = {f"gpu-{g.index}": str(g.uuid) for g in graph.gpus}
        names = {
            d["name"]: d["attributes"][f"{NIC_DRIVER}/ifName"]["string"] for d in nics["spec"]["devices"]
        }
        cdi = self.workdir / "cdi"
        self.driver = dra_plugin.FakeDraDriver(self.name, uuids, claim, cdi)
        self.nics = dra_plugin.FakeDraDriver.for_nics(self.name, names, claim, cdi)
        try:
            with (
                dra_plugin.serve(self.driver, self.workdir / "kubelet"),
                dra_plugin.serve(self.nics, self.workdir / "kubelet"),
            ):
                yield
        finally:
            for obj in self.slices:
                self.cp.request(
                    "DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{obj['metadata']['name']}"
                )

    def pcie_root(self, device: str) -> str | None:
        """The PCIe root a DRA device of this node is published under."""
        for obj in self.slices:
            for d in obj["spec"]["devices"]:
                if d["name"] == device:
                    return str(d["attributes"][dra.PCIE_ROOT]["string"])
        return None

    # --- containerd --------------------------------------------------------------------------

    def _start_containerd(self) -> None:
        w, bin_dir = self.workdir, self.bin_dir
        subnet = 100 + os.getpid() % 100
        (w / "cni").mkdir()
        (w / "cni" / "10-gangslice-e2e.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "gangslice-e2e",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": self.bridge,
                            "isGateway": True,
                            "ipMasq": False,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": f"10.244.{subnet}.0/24"}]],
                                "dataDir": str(w / "cni-ipam"),
                            },
                        }
                    ],
                }
            )
        )
        (w / "containerd.toml").write_text(
            f"""version = 3
root = "{w}/containerd/root"
state = "{w}/containerd/state"
[grpc]
  address = "{self.containerd_socket}"
[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "native"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "{PAUSE_IMAGE}"
  [plugins.'io.containerd.cri.v1.runtime']
    restrict_oom_score_adj = true
    enable_cdi = true
    cdi_spec_dirs = ["{w}/cdi"]
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["{bin_dir}"]
      conf_dir = "{w}/cni"
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = "{bin_dir}/runc"
          SystemdCgroup = false
"""
        )
        self.cp.start_process(
            f"containerd-{self.name}",
            [bin_dir / "containerd", "--config", w / "containerd.toml"],
            env=self.path_env,
        )
        wait_for("containerd's socket", lambda: self.containerd_socket.exists() or None, 30)

    @property
    def path_env(self) -> dict[str, str]:
        """``PATH`` with the built binaries first, for the processes of this node (containerd
        starts its runc shim from it)."""
        return {"PATH": f"{self.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}

    @property
    def bridge(self) -> str:
        return f"gse2e{os.getpid() % 10000}"

    def ctr(self, *args: str | Path, timeout: float = 300) -> str:
        proc = subprocess.run(
            [self.bin_dir / "ctr", "-a", self.containerd_socket, "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(map(str, args))} failed: {proc.stderr[-2000:]}")
        return proc.stdout

    def _import(self, *archives: Path) -> None:
        for archive in archives:
            self.ctr("images", "import", "--platform", "linux/amd64", archive)

    # --- kubelet -----------------------------------------------------------------------------

    def _start_kubelet(self) -> None:
        w = self.workdir
        port, healthz = free_ports(2)
        assert self.cp.ca_file is not None and self.cp.kubeconfig is not None
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": "127.0.0.1",
            "port": port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.cp.ca_file)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "failSwapOn": False,
            "resolvConf": "",
            # The test folder's file system is the machine's: evict for nothing it does.
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "cpuManagerPolicy": "static",
            "reservedSystemCPUs": "0",
            "topologyManagerPolicy": "single-numa-node",
            "serializeImagePulls": False,
            "podLogsDir": str(self.pod_logs),
            "syncFrequency": "5s",
            "nodeStatusUpdateFrequency": "5s",
        }
        self.kubelet_config_file.write_text(json.dumps(config, indent=1))
        # The kubelet's folder is a shared mount, so what the kubelet mounts there from its own
        # namespace (downward-API and projected volumes are tmpfs) reaches containerd and runc.
        root = w / "kubelet"
        root.mkdir()
        for args in (["--bind", root, root], ["--make-shared", root]):
            subprocess.run(["mount", *args], check=True)
        # Fixed in the kubelet, so shared by every kubelet of the machine: one real node at a time,
        # and never on a machine whose own kubelet serves there.
        DEVICE_PLUGINS.mkdir(parents=True, exist_ok=True)
        if _answers(DEVICE_PLUGINS / device_plugin.KUBELET_SOCKET):
            raise RuntimeError(
                f"a kubelet already serves {DEVICE_PLUGINS}: the real node needs a machine without one"
            )
        for stale in DEVICE_PLUGINS.iterdir():
            if not stale.is_dir():
                stale.unlink()
        labels = ",".join(f"{k}={v}" for k, v in self.labels.items())
        kubelet = [
            self.bin_dir / "kubelet",
            f"--config={self.kubelet_config_file}",
            f"--kubeconfig={self.cp.kubeconfig}",
            f"--root-dir={w / 'kubelet'}",
            f"--cert-dir={w / 'kubelet-pki'}",
            f"--hostname-override={self.name}",
            f"--node-labels={labels}",
            "--v=2",
        ]
        # A mount namespace of its own, where /sys (made a slave first, so nothing reaches the
        # machine's) shows the two-node NUMA tree; every other mount keeps its propagation.
        script = 'mount --make-rslave /sys && mount --bind "$1" "$2" && shift 2 && exec "$@"'
        argv = [
            "unshare", "--mount", "--propagation", "unchanged", "--", "sh", "-c", script, "sh",
            self.sysfs / "devices" / "system" / "node", NODE_SYSFS, *kubelet,
        ]  # fmt: skip
        self.cp.start_process(
            f"kubelet-{self.name}",
            argv,
            env=self.path_env,
        )

    def _ready(self) -> bool | None:
        node = get(self.cp, "Node", self.name)
        conditions = ((node or {}).get("status") or {}).get("conditions") or ()
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) or None

    def _gpus_advertised(self) -> bool | None:
        node = get(self.cp, "Node", self.name) or {}
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        return allocatable.get("nvidia.com/gpu") == str(len(self.plugin.uuids)) or None

    # --- gangslice's node agent ----------------------------------------------------------------

    @contextmanager
    def agent(self, fake: str) -> Iterator[dict[str, Any]]:
        """``gangslice agent`` for this node (every second): the fake board's NVML on this
        machine's NUMA nodes, the kubelet's configuration file and PodResources socket. Yields
        the NodeTopology spec once it holds the GPUs and the kubelet's policies."""
        cp = self.cp
        assert cp.workdir is not None
        kubeconfig = pod_token_kubeconfig(
            cp, cp.workdir / f"{self.name}-agent.kubeconfig", "gangslice-agent", self.name, image=PAUSE_IMAGE
        )
        argv = [
            Path(sys.executable).parent / "gangslice", "agent", f"--node={self.name}", f"--nvml-fake={fake}",
            f"--sysfs-root={self.sysfs}", f"--kubelet-config={self.kubelet_config_file}",
            f"--pod-resources-socket={self.pod_resources_socket}", f"--allocation={self.allocation}",
            f"--kubeconfig={kubeconfig}", "--interval=1", "--jitter=0",
        ]  # fmt: skip
        cp.start_process(f"gangslice-agent-{self.name}", argv)
        try:
            yield wait_for("the agent's NodeTopology with the kubelet's policies", self.published, 60)
        finally:
            cp.stop_process(f"gangslice-agent-{self.name}")
            delete(cp, "Pod", f"gangslice-agent-{self.name}", SYSTEM_NS)

    def published(self) -> dict[str, Any] | None:
        """The agent's NodeTopology spec, once it names GPUs and the kubelet's policies."""
        spec = (get(self.cp, "NodeTopology", self.name) or {}).get("spec") or {}
        return spec if spec.get("gpus") and spec.get("kubelet") else None

    def in_use(self) -> dict[str, list[int]]:
        """``<namespace>/<pod>`` -> GPU indices, as the agent published the kubelet's allocation."""
        out: dict[str, list[int]] = {}
        for d in (self.published() or {}).get("devicesInUse") or ():
            out.setdefault(f"{d['namespace']}/{d['pod']}", []).append(d["index"])
        return {k: sorted(v) for k, v in out.items()}

    # --- pods ------------------------------------------------------------------------------------

    def submit(self, ns: str, pod: dict[str, Any]) -> dict[str, Any]:
        """Create a :func:`workload_pod` in ``ns``, its hostPath pointed at this node's NUMA tree."""
        pod["metadata"]["namespace"] = ns
        for volume in pod["spec"]["volumes"]:
            if volume["name"] == "sys":
                volume["hostPath"]["path"] = str(self.sysfs)
        return create(self.cp, pod)

    def wait_running(self, ns: str, name: str, timeout: float = 120) -> dict[str, Any]:
        """The pod once Running; its containers' logs in the failure when it is not."""

        def up() -> dict[str, Any] | None:
            pod = get(self.cp, "Pod", name, ns) or {}
            status = pod.get("status") or {}
            if status.get("phase") in ("Failed", "Succeeded"):
                raise AssertionError(f"pod {ns}/{name} ended {status.get('phase')}: {status}")
            return pod if status.get("phase") == "Running" else None

        try:
            return wait_for(f"pod {ns}/{name} Running", up, timeout)
        except AssertionError as exc:
            logs = {c: self.log(ns, name, c)[-3000:] for c in ("preflight", "main")}
            raise AssertionError(f"{exc}\ncontainer logs: {logs}") from None

    def log(self, ns: str, name: str, container: str) -> str:
        """A container's log as the kubelet wrote it (CRI format), every restart in turn."""
        text = ""
        for d in self.pod_logs.glob(f"{ns}_{name}_*"):
            for f in sorted((d / container).glob("*.log")):
                text += f.read_text()
        return text

    def printed(self, ns: str, name: str, key: str) -> str:
        """What the pod's ``main`` container printed as ``key=...`` (see :func:`workload_pod`)."""

        def line() -> str | None:
            for raw in self.log(ns, name, "main").splitlines():
                _, _, message = raw.partition(" stdout F ")
                if message.startswith(key + "="):
                    return message.split("=", 1)[1]
            return None

        return wait_for(f"{ns}/{name} printing {key}", line, 60)

    # --- teardown ----------------------------------------------------------------------------

    def _stop_pods(self) -> None:
        """Every pod on this node deleted through the API (the kubelet stops their containers),
        then the kubelet itself."""
        for pod in items(self.cp, "Pod"):
            if (pod.get("spec") or {}).get("nodeName") == self.name:
                meta = pod["metadata"]
                delete(self.cp, "Pod", meta["name"], meta["namespace"])
        wait_for_or_false(
            lambda: (
                not any((p.get("spec") or {}).get("nodeName") == self.name for p in items(self.cp, "Pod"))
            ),
            60,
        )
        self.cp.stop_process(f"kubelet-{self.name}")
        delete(self.cp, "Node", self.name)

    def _clean(self) -> None:
        """Whatever outlived containerd (shims of containers not stopped), the mounts runc and
        containerd left under the folder, the bridge, the folder."""
        subprocess.run(
            ["pkill", "-KILL", "-f", f"containerd-shim-runc-v2 .*-address {self.containerd_socket}"]
        )
        time.sleep(0.5)
        mounts = [
            line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
            if line.split()[1].startswith(str(self.workdir))
        ]  # fmt: skip
        for mount in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _answers(socket: Path) -> bool:
    """Whether something listens on the unix socket ``socket``."""
    with sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM) as probe:
        try:
            probe.connect(str(socket))
        except OSError:
            return False
    return True


def pack_pause(binary: Path, out: Path) -> Path:
    return pack(out, PAUSE_IMAGE, {"pause": (binary.read_bytes(), 0o755)}, ["/pause"])


def oracle() -> Path:
    path, _ = gpuallocator.build()
    return path


def workload_pod(
    name: str,
    gpus: int,
    pool: str,
    fake: str,
    *,
    cpu: str = "100m",
    guaranteed: bool = False,
    strict: bool = False,
    scheduler: str = "gangslice-scheduler",
    node_name: str | None = None,
    claim_template: str | None = None,
) -> dict[str, Any]:
    """A pod of the project's image for a real node of ``pool`` with the fake board ``fake``:
    ``gangslice preflight`` first (``--strict-gpus`` with ``strict``), then ``gangslice pin``
    running a command that prints what the container was given (``visible=``, ``cpus=``,
    ``nccl=``: ``NCCL_IB_HCA`` from the pod's NIC annotation through the downward API, and
    ``nics=``: the NICs a DRA claim gave it). Its
    GPUs come from the device plugin, or with ``claim_template`` from a claim of that template."""
    pod = gpu_pod(name, 0 if claim_template else gpus, pool, scheduler=scheduler)
    limits: dict[str, str] = {} if claim_template else {"nvidia.com/gpu": str(gpus)}
    requests = {"cpu": cpu, **limits}
    if guaranteed:
        limits |= {"cpu": cpu, "memory": "256Mi"}
        requests |= {"memory": "256Mi"}
    env = [{"name": "GANGSLICE_NVML_FAKE", "value": fake}]
    for var, key in (
        ("NCCL_IB_HCA", "gangslice.io/nccl-ib-hca"),
        ("UCX_NET_DEVICES", "gangslice.io/ucx-net-devices"),
    ):
        env.append({"name": var, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{key}']"}}})
    mounts = [
        {"name": "podinfo", "mountPath": "/etc/podinfo", "readOnly": True},
        {"name": "sys", "mountPath": HOST_SYS, "readOnly": True},
    ]
    show = (
        "import os, time; print('visible=' + os.environ.get('NVIDIA_VISIBLE_DEVICES', ''), flush=True); "
        "print('cpus=' + ','.join(map(str, sorted(os.sched_getaffinity(0)))), flush=True); "
        "print('nccl=' + os.environ.get('NCCL_IB_HCA', ''), flush=True); "
        "print('nics=' + os.environ.get('GANGSLICE_TEST_NICS', ''), flush=True); time.sleep(3600)"
    )
    common = {"image": IMAGE, "imagePullPolicy": "Never", "env": env, "volumeMounts": mounts}
    pod["spec"]["initContainers"] = [
        {
            "name": "preflight",
            **common,
            "args": [
                "preflight",
                f"--expect-tp={gpus}",
                f"--sysfs-root={HOST_SYS}",
                *(["--strict-gpus"] if strict else []),
            ],
            "resources": {"limits": limits, "requests": requests},
        }
    ]
    pod["spec"]["containers"] = [
        {
            "name": "main",
            **common,
            "args": ["pin", f"--sysfs-root={HOST_SYS}", "--", "python3", "-c", show],
            "resources": {"limits": limits, "requests": requests},
        }
    ]
    pod["spec"]["volumes"] = [
        {
            "name": "podinfo",
            "downwardAPI": {
                "items": [{"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]
            },
        },
        {"name": "sys", "hostPath": {"path": "/__NODE_SYSFS__", "type": "Directory"}},
    ]
    if claim_template:
        for c in (*pod["spec"]["initContainers"], *pod["spec"]["containers"]):
            c["resources"]["claims"] = [{"name": "gpus"}]
        pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": claim_template}]
    if node_name:
        pod["spec"]["nodeName"] = node_name
        del pod["spec"]["schedulerName"]
    return pod
