"""A plain gang as a gang request: N pods like the one in hand (``gangslice.io/gang`` +
``gangslice.io/gang-size``), so the extender can place the whole gang on first sight."""

from __future__ import annotations

from extender.cost import Comm
from extender.kube import names
from extender.kube.pods import PodError, PodInfo
from extender.placement.request import GangRequest, PodSet

#: The pod set name of a plain gang whose pods name none.
DEFAULT_POD_SET = "pods"


def plain_gang_request(pod: PodInfo) -> GangRequest | None:
    """The gang request a plain gang pod implies, or None when it carries no gang size.
    Raises :class:`PodError` for a size or communication pattern that cannot be read."""
    gang = pod.gang
    size = pod.gang_size
    if gang is None or size is None:
        return None
    comm = Comm.NONE
    if pod.comm is not None:
        try:
            comm = Comm(pod.comm)
        except ValueError:
            known = ", ".join(c.value for c in Comm)
            raise PodError(f"pod {pod.key}: {names.COMM}={pod.comm!r} is not one of {known}") from None
    pod_set = PodSet(
        name=pod.pod_set or DEFAULT_POD_SET,
        count=size,
        gpus_per_pod=pod.gpus,
        comm=comm,
        required_level=pod.required_level,
        preferred_level=pod.preferred_level,
    )
    return GangRequest(name=gang, pod_sets=(pod_set,))
