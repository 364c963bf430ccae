"""Gauges for alerts: when the certificates the controller serves with run out, and how long
gangs have waited for their GPUs.

- ``gangslice_certificate_expiry_timestamp_seconds{certificate}``: the end of validity (Unix
  time) of the serving certificate (``serving``, the file of ``--tls-cert``) and of the CA
  beside it that clients verify it with (``ca``, ``ca.crt`` in the same folder, as the Secret
  gangslice-tls mounts it) and, with mutual TLS, of the CA client certificates must chain to
  (``client-ca``, ``--tls-client-ca``). Read at each scrape, so a rotated Secret shows at once.
- ``gangslice_gangs_waiting``: gangs with a GPU pod not bound to a node yet (plain gangs by
  ``gangslice.io/gang``, Volcano PodGroups, Kueue Workloads' pods by their reservation).
- ``gangslice_gang_longest_wait_seconds``: how long the gang that has waited longest has been
  waiting, counted from when this replica first saw it wait (a restart starts the clock again;
  Kueue's own metrics count from quota reservation).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from extender.kube.pods import PodInfo
from extender.reservations import ClusterCache


def certificate_files(tls_cert: str) -> dict[str, str]:
    """The certificates to watch for a server started with ``--tls-cert tls_cert``."""
    return {"serving": tls_cert, "ca": str(Path(tls_cert).with_name("ca.crt"))}


def not_after(pem_file: str) -> float | None:
    """The end of validity of the first certificate in a PEM file; None when unreadable."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(Path(pem_file).read_bytes())
    except (OSError, ValueError):
        return None
    return cert.not_valid_after_utc.timestamp()


def waiting_gang(pod: PodInfo) -> str | None:
    """The gang a GPU pod waits with, or None when it is placed, done, or in no gang."""
    if pod.gpus <= 0 or pod.node is not None or pod.terminal or pod.deleting:
        return None
    return pod.gang_key


class HealthCollector(Collector):
    def __init__(self, cache: ClusterCache, clock: Callable[[], float] = time.time) -> None:
        self.cache = cache
        self.clock = clock
        #: certificate name -> PEM file (filled by the server once it knows its files).
        self.certificates: dict[str, str] = {}
        self._waiting_since: dict[str, float] = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        expiry = GaugeMetricFamily(
            "gangslice_certificate_expiry_timestamp_seconds",
            "End of validity (Unix time) of the serving certificate and of its CA, by certificate.",
            labels=["certificate"],
        )
        for name, path in sorted(self.certificates.items()):
            at = not_after(path)
            if at is not None:
                expiry.add_metric([name], at)
        yield expiry
        now = self.clock()
        waiting = {g for p in self.cache.pods() if (g := waiting_gang(p)) is not None}
        self._waiting_since = {g: self._waiting_since.get(g, now) for g in waiting}
        yield GaugeMetricFamily(
            "gangslice_gangs_waiting", "Gangs with a GPU pod not bound to a node yet.", value=len(waiting)
        )
        longest = now - min(self._waiting_since.values(), default=now)
        yield GaugeMetricFamily(
            "gangslice_gang_longest_wait_seconds",
            "How long the longest-waiting gang has waited, since this replica first saw it wait.",
            value=longest,
        )
