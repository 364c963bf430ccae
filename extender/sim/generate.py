"""The default trace: one day of LLM inference deployments, generated from a seed.

Deployments arrive as a Poisson process whose rate follows the working day (quiet at night,
busiest mid-afternoon), on top of a base of long-running services present from the start.
Each picks a template from a mix (many small TP=1/2/4 replicas, Llama-70B TP=8, 405B over
two pipeline stages, DeepSeek wide expert parallelism over 4 to 16 nodes or inside one NVL72
rack, prefill/decode pairs), a replica count, a lifetime, and scales up and down while it
lives. Same seed, same trace: only ``random.Random(seed)`` is used.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from extender.sim.templates import builtin_templates
from extender.sim.trace import Deployment, Scale, Trace

DAY_S = 86_400.0
_MIN = 60.0


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
    """How much happens in the generated day. The defaults size the default run: about 460
    deployments and 3,000 gangs keep the cluster 80-90 % allocated with a queue at the
    afternoon peak, and all five policies finish in about half a minute on two cores."""

    base_deployments: int = 30  # present from the start, for the whole day
    arrivals: float = 450.0  # expected deployments arriving during the day
    mean_scale_interval_s: float = 3600.0
    min_lifetime_s: float = 1800.0
    duration_s: float = DAY_S


def _rate(t: float, duration: float) -> float:
    """Relative arrival rate over the day, between 0.3 (03:00) and 1.0 (15:00)."""
    return 0.65 + 0.35 * math.sin(2 * math.pi * (t / duration - 0.375))


def _pick(rnd: random.Random, mix: tuple[Kind, ...]) -> Kind:
    return rnd.choices(mix, weights=[k.weight for k in mix])[0]


def generate_trace(seed: int = 1, shape: TraceShape = TraceShape(), mix: tuple[Kind, ...] = MIX) -> Trace:
    rnd = random.Random(seed)
    templates = builtin_templates()
    day = shape.duration_s
    deployments: list[Deployment] = []
    scales: list[Scale] = []
    counter: dict[str, int] = {}

    def deploy(at: float, lifetime: float, kind: Kind) -> None:
        n = counter.get(kind.template, 0)
        counter[kind.template] = n + 1
        name = f"{kind.template}-{n}"
        replicas = rnd.randint(1, kind.max_replicas)
        deployments.append(Deployment(name, at, lifetime, replicas, templates[kind.template], kind.template))
        t = at
        while kind.max_replicas > 1:
            t += rnd.expovariate(1 / shape.mean_scale_interval_s)
            if t >= at + lifetime:
                break
            t = round(t)
            if t >= at + lifetime:
                break
            scales.append(Scale(t, name, rnd.randint(1, kind.max_replicas)))

    for _ in range(shape.base_deployments):
        deploy(0.0, day, _pick(rnd, mix))
    # Thinning: candidates at the peak rate, kept in proportion to the rate at their time.
    t = 0.0
    peak = shape.arrivals / day / 0.65
    while True:
        t += rnd.expovariate(peak)
        if t >= day - shape.min_lifetime_s:
            break
        if rnd.random() > _rate(t, day):
            continue
        kind = _pick(rnd, mix)
        lifetime = rnd.lognormvariate(math.log(kind.median_lifetime_s), 0.8)
        at = float(round(t))
        lifetime = float(round(min(max(lifetime, shape.min_lifetime_s), day - at)))
        deploy(at, lifetime, kind)
    deployments.sort(key=lambda d: d.at)
    scales.sort(key=lambda s: s.at)
    return Trace(tuple(deployments), tuple(scales), f"generated (seed {seed})")
