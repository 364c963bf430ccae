"""The real :class:`~extender.kube.api.KubeClient`, over the ``kubernetes`` package.

Every call goes through one request path (``ApiClient.param_serialize`` + ``call_api``, as
the generated API classes do), so each resource, built-in or custom, is addressed the same
way by its :class:`~extender.kube.api.Resource`, objects stay raw JSON (never the generated
models), and errors are mapped in one place.

The ``kubernetes`` package is blocking (urllib3); each call runs in the loop's default
thread executor, so the event loop that serves kube-scheduler never waits on the network.
That is the package the project already depends on, and a handful of threads per process is
cheap next to a second, async HTTP stack for the same API. A watch reads its stream in a
thread and hands events to the loop through a queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote

from extender.kube.api import (
    APPLY_PATCH,
    FIELD_MANAGER,
    MERGE_PATCH,
    PODS,
    KubeError,
    Listing,
    Resource,
    WatchEvent,
    error_for,
    name_of,
    namespace_of,
)

#: Seconds a single request may take before it counts as unavailable.
REQUEST_TIMEOUT_S = 30.0


def load_api_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """A ``kubernetes.client.ApiClient`` from ``kubeconfig``, or in-cluster, or the default
    kubeconfig; its configuration is its own, never the library's global default."""
    from kubernetes import client, config

    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, context=context, client_configuration=configuration
        )
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config(context=context, client_configuration=configuration)  # type: ignore[no-untyped-call]
    return client.ApiClient(configuration)


def path_of(res: Resource, namespace: str = "", name: str = "", subresource: str = "") -> str:
    base = f"/apis/{res.group}/{res.version}" if res.group else f"/api/{res.version}"
    if res.namespaced and namespace:
        base += f"/namespaces/{quote(namespace, safe='')}"
    base += f"/{res.plural}"
    if name:
        base += f"/{quote(name, safe='')}"
    if subresource:
        base += f"/{subresource}"
    return base


def _mapped(exc: BaseException) -> KubeError:
    """The typed error for a failure of the ``kubernetes`` package or of the connection."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, KubeError):
        return exc
    if isinstance(exc, ApiException):
        return error_for(int(exc.status or 0), _reason(exc))
    return error_for(0, f"{type(exc).__name__}: {exc}")


def _interrupt(resp: Any) -> None:
    """Close a streaming response that a reader thread may sit in ``recv`` on: shut the socket
    down first, so that read returns at once. Closing alone waits for the reader's lock on the
    buffered file, that is for the stream's next event or its end (a watch's timeout: minutes),
    and held up ``gangslice serve``'s exit that long."""
    sock = getattr(getattr(resp, "connection", None), "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(Exception):
        resp.close()


def _reason(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, (str, bytes)):
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and parsed.get("message"):
            return str(parsed["message"])
    return str(getattr(exc, "reason", "") or exc)


class ApiServerClient:
    """:class:`~extender.kube.api.KubeClient` over a ``kubernetes.client.ApiClient``."""

    def __init__(
        self, api_client: Any, *, field_manager: str = FIELD_MANAGER, timeout_s: float = REQUEST_TIMEOUT_S
    ) -> None:
        self.api_client = api_client
        #: The node agent applies NodeTopology as its own manager; everything else is ours.
        self.field_manager = field_manager
        self.timeout_s = timeout_s

    @classmethod
    def connect(cls, kubeconfig: str | None = None, context: str | None = None) -> ApiServerClient:
        return cls(load_api_client(kubeconfig, context))

    # -- the one request path --------------------------------------------------------------
    def _send(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str | None = None,
        stream: bool = False,
        timeout_s: float | None = None,
    ) -> Any:
        """Blocking; returns the decoded JSON body (or the raw urllib3 response for a stream)."""
        from kubernetes.client.exceptions import ApiException

        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        try:
            request = self.api_client.param_serialize(
                method=method,
                resource_path=path,
                query_params=query or [],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            resp = self.api_client.call_api(*request, _request_timeout=timeout_s or self.timeout_s)
            if not 200 <= resp.status <= 299:
                resp.read()
                raise ApiException.from_response(http_resp=resp, body=None, data=None)
            if stream:
                return resp.response
            data = resp.read()
        except Exception as exc:
            raise _mapped(exc) from exc
        return json.loads(data) if data else {}

    async def _call(self, method: str, path: str, **kw: Any) -> Any:
        return await asyncio.to_thread(self._send, method, path, **kw)

    # -- KubeClient ----------------------------------------------------------------------------
    async def get(self, res: Resource, name: str, namespace: str = "") -> dict[str, Any]:
        got: dict[str, Any] = await self._call("GET", path_of(res, namespace, name))
        return got

    async def list(self, res: Resource, namespace: str = "") -> Listing:
        body = await self._call("GET", path_of(res, namespace))
        items = body.get("items") or []
        rv = (body.get("metadata") or {}).get("resourceVersion", "")
        return Listing([i for i in items if isinstance(i, dict)], str(rv))

    async def watch(
        self, res: Resource, resource_version: str, timeout_s: float
    ) -> AsyncIterator[WatchEvent]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[WatchEvent | BaseException | None] = asyncio.Queue()
        stop = threading.Event()
        holder: dict[str, Any] = {}
        query = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(max(1, int(timeout_s)))),
        ]

        def put(item: WatchEvent | BaseException | None) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def read() -> None:
            from kubernetes.watch import watch as _watch

            iter_resp_lines: Any = _watch.iter_resp_lines
            try:
                resp = self._send("GET", path_of(res), query=query, stream=True, timeout_s=timeout_s + 30)
                holder["resp"] = resp
                for line in iter_resp_lines(resp):
                    if stop.is_set():
                        break
                    if not line or line.isspace():
                        continue
                    event = json.loads(line)
                    obj = event.get("object") if isinstance(event, dict) else None
                    if not isinstance(obj, dict):
                        continue
                    if event.get("type") == "ERROR":
                        put(error_for(int(obj.get("code") or 0), str(obj.get("message", "watch error"))))
                        return
                    put(WatchEvent(str(event.get("type")), obj))
            except BaseException as exc:  # handed to the loop, raised there
                if not stop.is_set():
                    put(_mapped(exc) if isinstance(exc, Exception) else exc)
                return
            finally:
                resp = holder.get("resp")
                if resp is not None:
                    with contextlib.suppress(Exception):
                        resp.release_conn()
            put(None)

        thread = threading.Thread(target=read, name=f"watch-{res.plural}", daemon=True)
        thread.start()
        try:
            while True:
                item = await queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            resp = holder.get("resp")
            if resp is not None:
                _interrupt(resp)

    async def create(self, res: Resource, obj: Mapping[str, Any], *, subresource: str = "") -> dict[str, Any]:
        name = name_of(obj) if subresource else ""
        got: dict[str, Any] = await self._call(
            "POST", path_of(res, namespace_of(obj), name, subresource), body=dict(obj)
        )
        return got

    async def replace(self, res: Resource, obj: Mapping[str, Any]) -> dict[str, Any]:
        got: dict[str, Any] = await self._call(
            "PUT", path_of(res, namespace_of(obj), name_of(obj)), body=dict(obj)
        )
        return got

    async def patch(
        self,
        res: Resource,
        name: str,
        body: Any,
        *,
        namespace: str = "",
        subresource: str = "",
        patch_type: str = MERGE_PATCH,
    ) -> dict[str, Any]:
        got: dict[str, Any] = await self._call(
            "PATCH", path_of(res, namespace, name, subresource), body=body, content_type=patch_type
        )
        return got

    async def apply(self, res: Resource, obj: Mapping[str, Any], *, subresource: str = "") -> dict[str, Any]:
        got: dict[str, Any] = await self._call(
            "PATCH",
            path_of(res, namespace_of(obj), name_of(obj), subresource),
            query=[("fieldManager", self.field_manager), ("force", "true")],
            body=dict(obj),
            content_type=APPLY_PATCH,
        )
        return got

    async def delete(self, res: Resource, name: str, namespace: str = "") -> None:
        await self._call("DELETE", path_of(res, namespace, name))

    async def evict(self, namespace: str, name: str, uid: str = "", *, dry_run: bool = False) -> None:
        eviction: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        options: dict[str, Any] = {}
        if uid:
            options["preconditions"] = {"uid": uid}
        if dry_run:
            options["dryRun"] = ["All"]
        if options:
            eviction["deleteOptions"] = options
        await self._call("POST", path_of(PODS, namespace, name, "eviction"), body=eviction)

    async def serves(self, res: Resource) -> bool:
        base = f"/apis/{res.group}/{res.version}" if res.group else f"/api/{res.version}"
        try:
            got = await self._call("GET", base)
        except KubeError:
            return False
        return any(r.get("name") == res.plural for r in got.get("resources") or ())
