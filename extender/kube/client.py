"""The real :class:`~extender.kube.api.KubeApi`, over the ``kubernetes`` Python client.

Objects are read as raw JSON (``_preload_content=False``), never through the generated
models, so they cross into the cache in the API's own shape; watch streams are read line
by line here, so a ``410 Gone`` ERROR event becomes :class:`~extender.kube.api.Gone`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from extender.kube import names
from extender.kube.api import ApiError, Kind, Listing, WatchEvent, error_for

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def load_api_client(kubeconfig: str | None = None) -> Any:
    """A ``kubernetes.client.ApiClient`` from ``kubeconfig``, or in-cluster, or the default kubeconfig."""
    from kubernetes import client, config

    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return client.ApiClient(configuration)


def _set_whole(member: str, value: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A JSON patch that sets (or replaces) a top-level member of an object."""
    return [{"op": "add", "path": f"/{member}", "value": dict(value)}]


def _raise(exc: Exception) -> ApiError:
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        return error_for(int(exc.status or 0), str(exc.reason or exc))
    return ApiError(0, f"{type(exc).__name__}: {exc}")


class RealKubeApi:
    def __init__(self, kubeconfig: str | None = None, context: str | None = None) -> None:
        from kubernetes import client as _client
        from kubernetes import config as _config

        # The client's own annotations are partial; it is used through Any here.
        client: Any = _client
        config: Any = _config
        if kubeconfig is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config(context=context)
        else:
            config.load_kube_config(config_file=kubeconfig, context=context)
        self._core: Any = client.CoreV1Api()
        self._custom: Any = client.CustomObjectsApi()
        self._client = client

    def _lister(self, kind: Kind) -> Callable[..., Any]:
        if kind is Kind.NODES:
            lister: Callable[..., Any] = self._core.list_node
            return lister
        if kind is Kind.PODS:
            lister = self._core.list_pod_for_all_namespaces
            return lister
        plural = names.NODE_TOPOLOGIES if kind is Kind.NODE_TOPOLOGIES else names.SLICE_RESERVATIONS

        def custom(**kw: Any) -> Any:
            return self._custom.list_cluster_custom_object(names.GROUP, names.VERSION, plural, **kw)

        return custom

    def list(self, kind: Kind) -> Listing:
        try:
            resp = self._lister(kind)(_preload_content=False)
            body = json.loads(resp.data)
        except Exception as exc:
            raise _raise(exc) from exc
        items = body.get("items") or []
        rv = (body.get("metadata") or {}).get("resourceVersion", "")
        return Listing([i for i in items if isinstance(i, dict)], str(rv))

    def watch(self, kind: Kind, resource_version: str, timeout_s: float) -> Iterator[WatchEvent]:
        from kubernetes.watch import watch as _watch

        iter_resp_lines: Any = _watch.iter_resp_lines
        try:
            resp = self._lister(kind)(
                watch=True,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=max(1, int(timeout_s)),
                _preload_content=False,
            )
        except Exception as exc:
            raise _raise(exc) from exc
        try:
            for line in iter_resp_lines(resp):
                if not line or line.isspace():
                    continue
                event = json.loads(line)
                obj = event.get("object") if isinstance(event, dict) else None
                if not isinstance(obj, dict):
                    continue
                if event.get("type") == "ERROR":
                    raise error_for(int(obj.get("code") or 0), str(obj.get("message", "watch error")))
                yield WatchEvent(str(event.get("type")), obj)
        except ApiError:
            raise
        except Exception as exc:
            raise _raise(exc) from exc
        finally:
            resp.close()
            resp.release_conn()

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            resp = self._core.read_namespaced_pod(name, namespace, _preload_content=False)
            got: dict[str, Any] = json.loads(resp.data)
            return got
        except Exception as exc:
            raise _raise(exc) from exc

    def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        self._patch_pod_metadata(namespace, name, {"annotations": dict(annotations)})

    def patch_pod_labels(self, namespace: str, name: str, labels: Mapping[str, str]) -> None:
        self._patch_pod_metadata(namespace, name, {"labels": dict(labels)})

    def _patch_pod_metadata(self, namespace: str, name: str, metadata: Mapping[str, Any]) -> None:
        body = {"metadata": dict(metadata)}
        try:
            self._core.patch_namespaced_pod(
                name, namespace, body, _content_type=MERGE_PATCH, _preload_content=False
            )
        except Exception as exc:
            raise _raise(exc) from exc

    def bind_pod(self, namespace: str, name: str, uid: str | None, node: str) -> None:
        c = self._client
        body = c.V1Binding(
            metadata=c.V1ObjectMeta(name=name, namespace=namespace, uid=uid or None),
            target=c.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        try:
            self._core.create_namespaced_pod_binding(name, namespace, body, _preload_content=False)
        except Exception as exc:
            raise _raise(exc) from exc

    def create_reservation(self, obj: Mapping[str, Any]) -> None:
        ns = obj["metadata"]["namespace"]
        try:
            self._custom.create_namespaced_custom_object(
                names.GROUP, names.VERSION, ns, names.SLICE_RESERVATIONS, dict(obj), _preload_content=False
            )
        except Exception as exc:
            raise _raise(exc) from exc

    def patch_reservation_spec(self, namespace: str, name: str, spec: Mapping[str, Any]) -> None:
        # The whole spec: a merge patch would keep unbound slots.
        try:
            self._custom.patch_namespaced_custom_object(
                names.GROUP,
                names.VERSION,
                namespace,
                names.SLICE_RESERVATIONS,
                name,
                _set_whole("spec", spec),
                _content_type=JSON_PATCH,
                _preload_content=False,
            )
        except Exception as exc:
            raise _raise(exc) from exc

    def patch_reservation_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        # The whole status, through its subresource: boundPods of freed slots go.
        try:
            self._custom.patch_namespaced_custom_object_status(
                names.GROUP,
                names.VERSION,
                namespace,
                names.SLICE_RESERVATIONS,
                name,
                _set_whole("status", status),
                _content_type=JSON_PATCH,
                _preload_content=False,
            )
        except Exception as exc:
            raise _raise(exc) from exc

    def delete_reservation(self, namespace: str, name: str) -> None:
        try:
            self._custom.delete_namespaced_custom_object(
                names.GROUP, names.VERSION, namespace, names.SLICE_RESERVATIONS, name, _preload_content=False
            )
        except Exception as exc:
            raise _raise(exc) from exc
