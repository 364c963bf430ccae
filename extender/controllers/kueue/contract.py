"""The Kueue AdmissionCheck contract (``kueue.x-k8s.io/v1beta2``), as plain functions.

Whether a Workload is ours and what to do with it (:func:`decide`), where in the wait for a
slice it is (:func:`wait_stage`), our check entry (:func:`check_entry`) and the bodies of
the server-side applies (:func:`workload_apply_body`, :func:`admission_check_apply_body`),
which carry only our own entries. The gang a Workload asks for is
:mod:`extender.controllers.kueue.workload_gang`'s; where Kueue lets it run,
:mod:`extender.controllers.kueue.assignment`'s.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from extender.controllers.api import KUEUE_API_VERSION
from extender.controllers.objects import object_ref
from extender.kube import names
from extender.kube.api import as_map

MESSAGE_LIMIT = 32768


@dataclass(frozen=True, slots=True)
class CheckConfig:
    """Timing of the wait for a slice, counted from the Workload's quota reservation.

    Until ``widen_after_s`` a pod set with a preferred level tighter than its required level
    waits for the preferred one; then the preferred level becomes a wish (placed within the
    required level). After another ``retry_after_s`` without a slice the check goes to
    ``Retry`` with ``requeue_after_s``, so Kueue releases the quota for others.
    """

    widen_after_s: float = 120.0
    retry_after_s: float = 600.0
    requeue_after_s: int = 60
    #: How often waiting Workloads are looked at again without an event.
    resync_s: float = 10.0
    #: How long a new reservation is held before its pods must start binding.
    hold_ttl_s: float = 600.0
    #: How long the Workloads of a joint gang (``gangslice.io/gang-members``) that have quota
    #: wait for the missing members before they give their quota back (Retry).
    member_wait_s: float = 300.0


# -- conditions --------------------------------------------------------------------------------


def _status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_map(obj.get("status"))


def condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for c in _status(obj).get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == kind:
            return c
    return None


def is_true(obj: Mapping[str, Any], kind: str) -> bool:
    c = condition(obj, kind)
    return c is not None and c.get("status") == "True"


# -- AdmissionChecks ---------------------------------------------------------------------------


def check_controller(ac: Mapping[str, Any]) -> str | None:
    spec = ac.get("spec")
    return (
        str(spec.get("controllerName")) if isinstance(spec, Mapping) and spec.get("controllerName") else None
    )


def is_our_check(ac: Mapping[str, Any]) -> bool:
    return check_controller(ac) == names.CHECK_CONTROLLER


def parameters_problem(ac: Mapping[str, Any]) -> str | None:
    """Why this check's ``parameters`` are unusable; None when there are none (we take none)."""
    spec = as_map(ac.get("spec"))
    params = spec.get("parameters")
    if not params:
        return None
    ref = f"{params.get('apiGroup', '')}/{params.get('kind', '')} {params.get('name', '')}".strip()
    return f"{names.CHECK_CONTROLLER} takes no parameters; remove spec.parameters ({ref})"


def active_condition(ac: Mapping[str, Any], now_text: str) -> dict[str, Any]:
    problem = parameters_problem(ac)
    generation = (ac.get("metadata") or {}).get("generation")
    cond: dict[str, Any] = {
        "type": "Active",
        "status": "False" if problem else "True",
        "reason": "BadParametersRef" if problem else "Active",
        "message": problem or "gangslice reserves a topology-coherent slice for each Workload",
        "lastTransitionTime": now_text,
    }
    if isinstance(generation, int):
        cond["observedGeneration"] = generation
    return cond


def admission_check_apply_body(ac: Mapping[str, Any], now_text: str) -> dict[str, Any] | None:
    """The SSA body that sets our ``Active`` condition, or None when it is already so."""
    want = active_condition(ac, now_text)
    have = condition(ac, "Active")
    same = ("status", "reason", "message", "observedGeneration")
    if have is not None and all(have.get(k) == want.get(k) for k in same):
        return None
    if have is not None and have.get("status") == want["status"] and have.get("lastTransitionTime"):
        want["lastTransitionTime"] = have["lastTransitionTime"]
    return {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "AdmissionCheck",
        "metadata": {"name": (ac.get("metadata") or {}).get("name")},
        "status": {"conditions": [want]},
    }


# -- Workloads: is it ours, what to do ---------------------------------------------------------


def gang_key(wl: Mapping[str, Any]) -> str:
    """The ledger key of a Workload's gang: ``<namespace>/<name>``."""
    ns, name = object_ref(wl)
    return f"{ns}/{name}"


def our_entries(wl: Mapping[str, Any], our_checks: Collection[str]) -> list[Mapping[str, Any]]:
    return [
        e
        for e in _status(wl).get("admissionChecks") or ()
        if isinstance(e, Mapping) and e.get("name") in our_checks
    ]


class Action(enum.Enum):
    IGNORE = "ignore"  # not ours, or nothing to do now
    PLACE = "place"  # quota reserved, our check Pending: find and reserve a slice
    KEEP = "keep"  # our check Ready: hold the reservation
    RELEASE = "release"  # finished, evicted, deactivated, lost its quota or our check


def decide(wl: Mapping[str, Any], our_checks: Collection[str], holds: bool) -> tuple[Action, str]:
    """What to do with a Workload, and why (for logs). ``holds``: we have a reservation for it."""
    drop = Action.RELEASE if holds else Action.IGNORE
    entries = our_entries(wl, our_checks)
    if not entries:
        return drop, "no admission check of ours"
    if is_true(wl, "Finished"):
        return drop, "finished"
    if is_true(wl, "Evicted"):
        return drop, "evicted"
    spec = as_map(wl.get("spec"))
    if spec.get("active") is False:
        return drop, "deactivated"
    if not is_true(wl, "QuotaReserved") or not _status(wl).get("admission"):
        return drop, "no quota reserved"
    states = {str(e.get("state")) for e in entries}
    if states & {"Retry", "Rejected"}:
        return drop, "our check is " + "/".join(sorted(states & {"Retry", "Rejected"}))
    for psa in (_status(wl).get("admission") or {}).get("podSetAssignments") or ():
        if isinstance(psa, Mapping) and psa.get("delayedTopologyRequest") == "Pending":
            return Action.IGNORE, "Kueue's topology assignment is delayed"
    if states == {"Ready"}:
        return Action.KEEP, "our check is Ready"
    return Action.PLACE, "quota reserved, our check is Pending"


def pod_sets(wl: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [p for p in as_map(wl.get("spec")).get("podSets") or () if isinstance(p, Mapping)]


def assignments(wl: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """``status.admission.podSetAssignments`` by pod set name."""
    admission = as_map(_status(wl).get("admission"))
    return {str(a.get("name")): a for a in admission.get("podSetAssignments") or () if isinstance(a, Mapping)}


# -- the wait ----------------------------------------------------------------------------------


class Stage(enum.Enum):
    STRICT = "strict"  # holding out for the preferred levels
    WIDENED = "widened"  # preferred levels are wishes now
    RETRY = "retry"  # give the quota back


def wait_started(wl: Mapping[str, Any]) -> str | None:
    """When the wait began: the QuotaReserved transition (an RFC 3339 string)."""
    c = condition(wl, "QuotaReserved")
    got = c.get("lastTransitionTime") if c is not None else None
    return str(got) if got else None


def wait_stage(elapsed_s: float, cfg: CheckConfig) -> Stage:
    if elapsed_s < cfg.widen_after_s:
        return Stage.STRICT
    if elapsed_s < cfg.widen_after_s + cfg.retry_after_s:
        return Stage.WIDENED
    return Stage.RETRY


# -- status writes -----------------------------------------------------------------------------


def check_entry(
    current: Mapping[str, Any],
    state: str,
    message: str,
    now_text: str,
    pod_set_updates: list[dict[str, Any]] | None = None,
    requeue_after_s: int | None = None,
) -> dict[str, Any]:
    """Our full ``admissionChecks`` entry; ``lastTransitionTime`` moves only with the state."""
    ltt = current.get("lastTransitionTime") if current.get("state") == state else None
    if len(message) > MESSAGE_LIMIT:
        message = message[: MESSAGE_LIMIT - 3] + "..."
    entry: dict[str, Any] = {
        "name": str(current["name"]),
        "state": state,
        "message": message,
        "lastTransitionTime": str(ltt or now_text),
        # Sent even when empty: Kueue's own field manager co-owns the field, so leaving it
        # out would not clear it.
        "podSetUpdates": list(pod_set_updates or []),
    }
    if requeue_after_s is not None:
        entry["requeueAfterSeconds"] = int(requeue_after_s)
    return entry


def entry_unchanged(current: Mapping[str, Any], entry: Mapping[str, Any]) -> bool:
    keys = ("state", "message", "podSetUpdates", "requeueAfterSeconds")
    return all((current.get(k) or None) == (entry.get(k) or None) for k in keys)


def workload_apply_body(wl: Mapping[str, Any], entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The SSA body for ``/status``: identity, the resourceVersion read (a stale read fails
    with 409 instead of overwriting), and only our entries."""
    ns, name = object_ref(wl)
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    rv = as_map(wl.get("metadata")).get("resourceVersion")
    if rv:
        meta["resourceVersion"] = str(rv)
    return {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "Workload",
        "metadata": meta,
        "status": {"admissionChecks": entries},
    }
