"""The caBundle of gangslice's MutatingWebhookConfiguration, kept equal to the CA that signed
its serving certificate.

The API server calls the DRA pinning webhook over HTTPS and trusts only the ``caBundle`` of
each entry. cert-manager's CA injector fills it where cert-manager issues the certificate;
without cert-manager (``hack/gen-certs.sh``, or a Secret of your own) the controller does it
itself: ``serve --webhook-ca-bundle FILE`` (the Secret's ``ca.crt``) makes the leader's
housekeeping set that CA on every entry of ``--webhook-configuration`` that calls one of
gangslice's admission paths, and set it again when the file changes (a rotated CA) or
someone resets the field (a GitOps tool applying the manifest without it). Entries calling
anything else are left alone. The write is a replace guarded by the object's
resourceVersion, so it never overwrites a change it did not see.

This module is the one writer of MutatingWebhookConfigurations.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extender.kube.api import MUTATING_WEBHOOKS, KubeClient, KubeError, NotFound

log = logging.getLogger(__name__)

#: The paths gangslice serves admission reviews on (extender/httpapi/admission.py).
ADMISSION_PATH_PREFIX = "/admission/"
#: How often a current caBundle is read again (a reset by someone else is put right then).
RECHECK_S = 60.0
#: How often a configuration not found (DRA installed after gangslice), or a failed
#: attempt, is tried again.
ABSENT_RECHECK_S = 15.0


class CaBundleError(ValueError):
    """The CA file cannot serve as a caBundle; the message names the file and the problem."""


def read_ca(path: str) -> bytes:
    """The PEM certificates of ``path``, checked: at least one, each decodable."""
    try:
        text = Path(path).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise CaBundleError(f"{path}: cannot read the CA: {exc}") from None
    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    blocks = [b for b in text.split(end) if begin in b]
    if not blocks:
        raise CaBundleError(f"{path}: no PEM certificate ({begin}) in the file")
    for i, block in enumerate(blocks, 1):
        try:
            ssl.PEM_cert_to_DER_cert(block[block.index(begin) :] + end)
        except (ValueError, binascii.Error) as exc:
            raise CaBundleError(f"{path}: certificate {i} is not valid PEM: {exc}") from None
    return text.encode()


def ours(hook: Mapping[str, Any]) -> bool:
    """Whether a webhook entry calls one of gangslice's admission paths (by Service or URL)."""
    client = hook.get("clientConfig") or {}
    service = client.get("service") or {}
    path = str(service.get("path") or "")
    if not path and client.get("url"):
        rest = str(client["url"]).split("://", 1)[-1]
        path = "/" + rest.split("/", 1)[1] if "/" in rest else ""
    return path.startswith(ADMISSION_PATH_PREFIX)


@dataclass
class WebhookCa:
    api: KubeClient
    configuration: str
    ca_file: str
    clock: Callable[[], float] = time.monotonic
    recheck_s: float = RECHECK_S

    def __post_init__(self) -> None:
        self._stamp: tuple[int, int, int] | None = None
        self._checked_at: float | None = None
        #: The last outcome: patched, current, absent (no such configuration) or the error.
        self.state = ""

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.ca_file)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def due(self) -> bool:
        """Whether to look again: never done, not set yet (or failed), the file changed, or a
        while passed since the bundle was set or found current (or the configuration absent)."""
        if self._checked_at is None:
            return True
        # Absent, or a failure (a missing RBAC rule, an unreadable file): look again soon,
        # not on every housekeeping tick.
        wait = self.recheck_s if self.state in ("patched", "current") else ABSENT_RECHECK_S
        return self._file_stamp() != self._stamp or self.clock() - self._checked_at >= wait

    async def sync(self) -> str:
        """Set the CA on our entries where it differs; returns the outcome (also :attr:`state`)."""
        if not self.due():
            return self.state
        stamp = self._file_stamp()
        try:
            bundle = base64.b64encode(read_ca(self.ca_file)).decode()
            self.state = await self._apply(bundle)
        except CaBundleError as exc:
            self.state = str(exc)
            log.error("webhook caBundle not set: %s", exc)
        except KubeError as exc:
            self.state = f"MutatingWebhookConfiguration {self.configuration}: {exc}"
            log.warning("webhook caBundle not set: %s", self.state)
        self._stamp, self._checked_at = stamp, self.clock()
        return self.state

    async def _apply(self, bundle: str) -> str:
        try:
            cfg = await self.api.get(MUTATING_WEBHOOKS, self.configuration)
        except NotFound:
            log.debug(
                "MutatingWebhookConfiguration %s does not exist (DRA not installed)", self.configuration
            )
            return "absent"
        hooks = [dict(h) for h in cfg.get("webhooks") or []]
        changed = 0
        for hook in hooks:
            client = dict(hook.get("clientConfig") or {})
            if ours(hook) and client.get("caBundle") != bundle:
                client["caBundle"] = bundle
                hook["clientConfig"] = client
                changed += 1
        if not changed:
            return "current"
        # A replace carries the resourceVersion read: a change made since is never overwritten
        # (409; the next housekeeping reads it again).
        await self.api.replace(MUTATING_WEBHOOKS, {**cfg, "webhooks": hooks})
        log.info(
            "set the caBundle of %d webhook(s) of MutatingWebhookConfiguration %s from %s",
            changed,
            self.configuration,
            self.ca_file,
        )
        return "patched"
