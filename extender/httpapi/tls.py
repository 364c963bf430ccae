"""TLS for the extender: a server context whose certificate is reloaded when its files change
(cert-manager rotates the Secret; the mounted files change under a running server).

With a client CA (``serve --tls-client-ca``) the context asks every client for a certificate
(CERT_OPTIONAL): one that does not chain to the CA fails the handshake; a client without one
(a kubelet probe) completes it, and the routes decide (extender.httpapi.access): health
endpoints answer, the verbs refuse with 403. A changed CA file is loaded too; its
certificates are added to the ones trusted (OpenSSL cannot drop a trusted CA from a live
context), so a rotation to a new CA works at once and the old CA stops being trusted at
the next restart.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import ssl
import tempfile

log = logging.getLogger(__name__)


class ReloadingTls:
    def __init__(self, cert_file: str, key_file: str, client_ca: str | None = None) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca = client_ca
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._stamp = self._read_stamp()
        self.context.load_cert_chain(cert_file, key_file)
        if client_ca:
            self.context.verify_mode = ssl.CERT_OPTIONAL
            self.context.load_verify_locations(cafile=client_ca)
        self.reloads = 0

    def _read_stamp(self) -> tuple[int, ...]:
        # Inode too: a mounted Secret is updated by swapping a symlink, not by rewriting.
        files = [self.cert_file, self.key_file, *([self.client_ca] if self.client_ca else [])]
        return tuple(v for f in files for st in [os.stat(f)] for v in (st.st_mtime_ns, st.st_size, st.st_ino))

    def reload_if_changed(self) -> bool:
        """Load the files again if they changed; new handshakes use them. A half-written
        pair (cert and key not matching yet) keeps the old certificate until the next try."""
        try:
            stamp = self._read_stamp()
        except OSError as exc:
            log.warning("TLS files unreadable, keeping the current certificate: %s", exc)
            return False
        if stamp == self._stamp:
            return False
        try:
            self._load_checked()
        except (ssl.SSLError, OSError) as exc:
            log.warning("TLS files changed but do not load yet: %s", exc)
            return False
        self._stamp = stamp
        self.reloads += 1
        log.info("reloaded TLS certificate from %s", self.cert_file)
        return True

    def _load_checked(self) -> None:
        """A failed load leaves a context half-changed (new certificate, old key), so the
        pair is copied once (the files may change again meanwhile), tried on a scratch
        context, and only then loaded into the live one."""
        with tempfile.TemporaryDirectory() as folder:
            cert, key = os.path.join(folder, "tls.crt"), os.path.join(folder, "tls.key")
            shutil.copyfile(self.cert_file, cert)
            shutil.copyfile(self.key_file, key)
            os.chmod(key, 0o600)
            scratch = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            scratch.load_cert_chain(cert, key)
            ca = None
            if self.client_ca:
                ca = os.path.join(folder, "ca.crt")
                shutil.copyfile(self.client_ca, ca)
                scratch.load_verify_locations(cafile=ca)
            self.context.load_cert_chain(cert, key)
            if ca:
                self.context.load_verify_locations(cafile=ca)

    async def watch(self, every_s: float = 10.0) -> None:
        while True:
            await asyncio.sleep(every_s)
            self.reload_if_changed()
