"""kopf wiring: watch AdmissionChecks and Workloads (``kueue.x-k8s.io/v1beta2``) and hand
every event to the :class:`~extender.controllers.kueue.controller.AdmissionController`; where Volcano
is installed, also PodGroups, for the
:class:`~extender.controllers.podgroups.controller.PodGroupController`. Pods are not watched
here: their events come from the cluster cache's watch (:mod:`extender.controllers.pods`).

Only ``@kopf.on.event`` handlers: they keep no progress on the object (no annotations,
no finalizers, no status writes by kopf, each of which would trigger Kueue's reconcile and
a merge patch would wipe Kueue's check entries). Every write is the controller's own
server-side apply. kopf's own Kubernetes Events for handler logs are switched off; the
controller posts its own (reserved, waiting, released).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from extender.controllers.api import (
    ADMISSION_CHECKS,
    KUEUE_GROUP,
    KUEUE_VERSION,
    PODGROUP_GROUP,
    PODGROUP_VERSION,
    PODGROUPS,
    WORKLOADS,
)
from extender.controllers.kueue.controller import AdmissionController
from extender.controllers.podgroups.controller import PodGroupController


def operator_settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.posting.enabled = False
    # No CRD/namespace scanning: the resources are named, and it would need extra RBAC.
    settings.scanning.disabled = True
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    return settings


def _event_type(event: Mapping[str, Any]) -> str | None:
    got = event.get("type")
    return str(got) if got else None


def register(
    registry: kopf.OperatorRegistry,
    controller: AdmissionController,
    api_client: Any | None,
    podgroups: PodGroupController | None = None,
) -> None:
    """Add the handlers (and, with ``api_client``, a login from its configuration) to ``registry``;
    with ``podgroups``, also Volcano PodGroups."""

    if controller.kueue:

        @kopf.on.event(KUEUE_GROUP, KUEUE_VERSION, ADMISSION_CHECKS, registry=registry)
        async def admission_check_event(event: Mapping[str, Any], **_: Any) -> None:
            await controller.on_admission_check(_event_type(event), dict(event["object"]))

        @kopf.on.event(KUEUE_GROUP, KUEUE_VERSION, WORKLOADS, registry=registry)
        async def workload_event(event: Mapping[str, Any], **_: Any) -> None:
            await controller.on_workload(_event_type(event), dict(event["object"]))

    if podgroups is not None:
        pg = podgroups

        @kopf.on.event(PODGROUP_GROUP, PODGROUP_VERSION, PODGROUPS, registry=registry)
        async def podgroup_event(event: Mapping[str, Any], **_: Any) -> None:
            await pg.on_podgroup(_event_type(event), dict(event["object"]))

    if api_client is not None:

        @kopf.on.login(registry=registry)
        def login(**_: Any) -> kopf.ConnectionInfo:
            return connection_info(api_client)


def connection_info(api_client: Any) -> kopf.ConnectionInfo:
    """kopf's credentials from the ``kubernetes`` client's configuration (the same kubeconfig
    or service account the controller's own calls use)."""
    cfg = api_client.configuration
    header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization")
    parts = header.split(" ", 1) if header else []
    scheme, token = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0] if parts else None)
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        username=cfg.username or None,
        password=cfg.password or None,
        scheme=scheme,
        token=token,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
    )
