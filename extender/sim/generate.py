"""The default trace: one day in the life of an LLM inference fleet, generated from a seed.

- **Deployments** arrive as a Poisson process whose rate follows the working day (quiet at
  night, busiest mid-afternoon), on top of a base of long-running services present from the
  start. Each picks a template from a mix (many small TP=1/2/4 replicas, Llama-70B TP=8, 405B
  over two pipeline stages, DeepSeek wide expert parallelism over 4 to 16 nodes or inside one
  NVL72 rack, prefill/decode pairs) and a lifetime.
- **Autoscaling**: each deployment has a peak replica count; every :data:`AUTOSCALE_PERIOD_S`
  an autoscaler sets the replicas to the peak times the diurnal load (with its own phase and
  noise), as llm-d's autoscaler or an HPA on the serving load would; a change is a scale event.
- **Rollouts**: a deployment rolls to a new revision :data:`ROLLOUTS_PER_DAY` times a day on
  average, in working hours.
- **Node failures**: each node fails at its GPU model's rate (:func:`failures_per_day`) and
  comes back after a repair time.
- **Load**: the day is sized to the fleet (:func:`extender.sim.inputs.fitted_day`): the
  arrivals and the base are scaled until the GPU-hours the deployments ask for are ``load``
  times what the fleet has.

Same seed, shape and fleet, same trace: every draw comes from random streams seeded by the seed.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass

from extender.placement.snapshot import ClusterSnapshot
from extender.sim.templates import builtin_template_life, builtin_templates
from extender.sim.trace import Deployment, NodeDown, Rollout, Scale, Trace
from extender.topology.gpus import GB200, L4, L40S, node_gpu

DAY_S = 86_400.0
_MIN = 60.0
#: Seconds between two autoscaler decisions (each may change a deployment's replicas).
AUTOSCALE_PERIOD_S = 20 * _MIN
#: Rollouts per deployment per day: a fleet rolls each model about twice a week.
ROLLOUTS_PER_DAY = 2 / 7
#: Unexpected interruptions of an 8-GPU H100 node per day: 419 in 54 days on 16,384 H100 GPUs
#: (2,048 nodes) in Meta's Llama 3 training run (Llama 3 Herd of Models, 2024, table 5).
NODE_FAILURES_PER_DAY = 419 / 54 / 2048
#: Median hours until a failed node is back (a reset or reboot; a part swap takes longer).
MEDIAN_REPAIR_H = 3.0
#: The demand the day asks of the fleet, in GPU-hours over the fleet's GPU-hours.
DEFAULT_LOAD = 1.2
#: The most a generated day's arrivals are scaled up (a fleet about this many times the default
#: one); a larger fleet gets this many.
MAX_SCALE = 64.0


@dataclass(frozen=True, slots=True)
class Kind:
    """One entry of the mix: a template, how often it is deployed, how far it scales."""

    template: str
    weight: float
    max_replicas: int
    median_lifetime_s: float


#: The deployment mix of the default trace (weights are relative arrival rates).
MIX: tuple[Kind, ...] = (
    Kind("llama-8b-tp1", 22, 10, 55 * _MIN),
    Kind("qwen-14b-tp2", 14, 8, 55 * _MIN),
    Kind("llama-70b-fp8-tp4", 12, 6, 70 * _MIN),
    Kind("llama-70b-tp8", 12, 4, 70 * _MIN),
    Kind("llama-405b-tp8-pp2", 5, 2, 90 * _MIN),
    Kind("deepseek-v3-wideep-4", 3, 2, 90 * _MIN),
    Kind("deepseek-v3-wideep-8", 2, 1, 90 * _MIN),
    Kind("deepseek-v3-wideep-16", 0.7, 1, 70 * _MIN),
    Kind("deepseek-v3-wideep-nvl72-8", 2, 2, 90 * _MIN),
    Kind("deepseek-v3-wideep-nvl72-16", 1, 1, 70 * _MIN),
    Kind("llama-70b-pd", 6, 3, 70 * _MIN),
    Kind("deepseek-v3-pd-nvl72", 2, 2, 70 * _MIN),
)


@dataclass(frozen=True, slots=True)
class TraceShape:
    """How much happens in the generated day (before :func:`extender.sim.inputs.fitted_day`
    scales it)."""

    base_deployments: int = 30  # present from the start, for the whole day
    arrivals: float = 450.0  # expected deployments arriving during the day
    min_lifetime_s: float = 1800.0
    duration_s: float = DAY_S
    rollouts_per_day: float = ROLLOUTS_PER_DAY
    #: Multiplies every node type's failure rate (0: no failures).
    failure_scale: float = 1.0

    def scaled(self, factor: float) -> TraceShape:
        return dataclasses.replace(
            self,
            base_deployments=max(1, round(self.base_deployments * factor)),
            arrivals=self.arrivals * factor,
        )


def load_curve(t: float, duration: float) -> float:
    """Relative load over the day, between 0.3 (03:00) and 1.0 (15:00)."""
    return 0.65 + 0.35 * math.sin(2 * math.pi * (t / duration - 0.375))


def failures_per_day(node_labels: dict[str, str], graph_model: str | None) -> float:
    """A node's failures per day by its GPU model: :data:`NODE_FAILURES_PER_DAY` for HGX-class
    nodes; twice that for a GB200 tray (assumed: a rack-scale system's NVLink switch trays and
    liquid cooling add parts; no public per-tray figure), half for PCIe L40S/L4 boxes (assumed:
    no NVSwitch, lower power)."""
    spec = node_gpu(node_labels, graph_model)
    if spec is GB200:
        return 2 * NODE_FAILURES_PER_DAY
    if spec in (L40S, L4):
        return NODE_FAILURES_PER_DAY / 2
    return NODE_FAILURES_PER_DAY


def _pick(rnd: random.Random, mix: tuple[Kind, ...]) -> Kind:
    return rnd.choices(mix, weights=[k.weight for k in mix])[0]


def generate_trace(
    seed: int = 1,
    shape: TraceShape = TraceShape(),
    mix: tuple[Kind, ...] = MIX,
    fleet: ClusterSnapshot | None = None,
) -> Trace:
    """One generated day; node failures need the ``fleet`` (none without it).

    Each deployment draws from a random stream of its own, and arrivals are drawn at
    :data:`MAX_SCALE` times the default rate and thinned: a day scaled up keeps every
    deployment of the day scaled down and adds more (demand grows with the scale)."""
    templates = builtin_templates()
    lives = builtin_template_life()
    day = shape.duration_s
    deployments: list[Deployment] = []
    scales: list[Scale] = []
    rollouts: list[Rollout] = []
    counter: dict[str, int] = {}

    def deploy(rnd: random.Random, at: float, lifetime: float, kind: Kind) -> None:
        n = counter.get(kind.template, 0)
        counter[kind.template] = n + 1
        name = f"{kind.template}-{n}"
        peak = rnd.randint(1, kind.max_replicas)
        phase = rnd.uniform(-2, 2) * 3600

        def desired(t: float) -> int:
            noise = rnd.uniform(0.85, 1.15)
            return max(1, min(kind.max_replicas, round(peak * load_curve(t + phase, day) * noise)))

        replicas = desired(at)
        gang, life = templates[kind.template], lives[kind.template]
        deployments.append(Deployment(name, at, lifetime, replicas, gang, kind.template, life))
        now = replicas
        t = at + rnd.uniform(0.5, 1.5) * AUTOSCALE_PERIOD_S  # autoscalers tick out of step
        while kind.max_replicas > 1 and t < at + lifetime:
            want = desired(t)
            if want != now:
                scales.append(Scale(float(round(t)), name, want))
                now = want
            t += AUTOSCALE_PERIOD_S
        expected = shape.rollouts_per_day * lifetime / day
        for _ in range(_poisson(rnd, expected)):
            start, stop = max(at, 9 * 3600.0), min(at + lifetime, 18 * 3600.0)
            if stop - start > 600:
                rollouts.append(Rollout(float(round(rnd.uniform(start, stop - 600))), name))

    base = random.Random(f"{seed}/base")
    for _ in range(shape.base_deployments):
        own = random.Random(base.getrandbits(64))
        deploy(own, 0.0, day, _pick(own, mix))
    # Thinning: candidates at the peak rate of the most scaled-up day, each kept in proportion
    # to this day's scale and to the rate at its time.
    arrivals = random.Random(f"{seed}/arrivals")
    peak_rate = TraceShape().arrivals / day / 0.65 * MAX_SCALE
    keep = min(1.0, shape.arrivals / TraceShape().arrivals / MAX_SCALE)
    t = 0.0
    while True:
        t += arrivals.expovariate(peak_rate)
        if t >= day - shape.min_lifetime_s:
            break
        u, stream = arrivals.random(), arrivals.getrandbits(64)
        if u >= keep * load_curve(t, day):
            continue
        own = random.Random(stream)
        kind = _pick(own, mix)
        lifetime = own.lognormvariate(math.log(kind.median_lifetime_s), 0.8)
        at = float(round(t))
        lifetime = float(round(min(max(lifetime, shape.min_lifetime_s), day - at)))
        deploy(own, at, lifetime, kind)
    downs = _failures(random.Random(f"{seed}/failures"), fleet, shape) if fleet is not None else []
    deployments.sort(key=lambda d: d.at)
    scales.sort(key=lambda s: s.at)
    rollouts.sort(key=lambda r: r.at)
    return Trace(
        tuple(deployments),
        tuple(scales),
        f"generated (seed {seed})",
        rollouts=tuple(rollouts),
        node_downs=tuple(downs),
    )


def _poisson(rnd: random.Random, mean: float) -> int:
    k, t = 0, rnd.expovariate(1.0)
    while t < mean:
        k += 1
        t += rnd.expovariate(1.0)
    return k


def _failures(rnd: random.Random, fleet: ClusterSnapshot, shape: TraceShape) -> list[NodeDown]:
    out = []
    day = shape.duration_s
    for node in fleet.nodes:
        rate = failures_per_day(dict(node.labels), node.graph.model) * shape.failure_scale
        t = rnd.expovariate(rate / day) if rate > 0 else math.inf
        while t < day:
            repair = max(1800.0, rnd.lognormvariate(math.log(MEDIAN_REPAIR_H * 3600), 0.8))
            out.append(NodeDown(float(round(t)), node.name, float(round(repair))))
            t += repair + rnd.expovariate(rate / day)
    return sorted(out, key=lambda f: (f.at, f.node))


def deployment_demand(trace: Trace) -> dict[str, float]:
    """GPU-hours each deployment of a trace asks for (replicas x GPUs over its life)."""
    by_name: dict[str, list[Scale]] = {}
    for s in trace.scales:
        by_name.setdefault(s.deployment, []).append(s)
    out = {}
    for d in trace.deployments:
        total = 0.0
        t, replicas = d.at, d.replicas
        for s in by_name.get(d.name, []):
            total += (s.at - t) * replicas * d.gang.gpus
            t, replicas = s.at, s.replicas
        total += (d.end - t) * replicas * d.gang.gpus
        out[d.name] = total / 3600
    return out


def demand_gpu_hours(trace: Trace) -> float:
    """GPU-hours the deployments of a trace ask for."""
    return sum(deployment_demand(trace).values())
