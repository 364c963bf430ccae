"""Names of the Kueue and Volcano APIs the controllers watch and write.

The calls themselves go through the one client, :class:`extender.kube.api.KubeClient`
(resources :data:`~extender.kube.api.WORKLOADS`, :data:`~extender.kube.api.ADMISSION_CHECKS`,
:data:`~extender.kube.api.RESOURCE_FLAVORS`, :data:`~extender.kube.api.PODGROUPS`); status
writes are server-side apply with field manager :data:`FIELD_MANAGER`.
"""

from __future__ import annotations

from extender.kube import api as kube

KUEUE_GROUP = kube.WORKLOADS.group
KUEUE_VERSION = kube.WORKLOADS.version
KUEUE_API_VERSION = kube.WORKLOADS.api_version
WORKLOADS = kube.WORKLOADS.plural
ADMISSION_CHECKS = kube.ADMISSION_CHECKS.plural
RESOURCE_FLAVORS = kube.RESOURCE_FLAVORS.plural
FIELD_MANAGER = kube.FIELD_MANAGER
PODGROUP_GROUP = kube.PODGROUPS.group
PODGROUP_VERSION = kube.PODGROUPS.version
PODGROUPS = kube.PODGROUPS.plural
