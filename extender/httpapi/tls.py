"""TLS for the extender: a server context whose certificate is reloaded when its files change
(cert-manager rotates the Secret; the mounted files change under a running server)."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import ssl
import tempfile

log = logging.getLogger(__name__)


class ReloadingTls:
    def __init__(self, cert_file: str, key_file: str) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._stamp = self._read_stamp()
        self.context.load_cert_chain(cert_file, key_file)
        self.reloads = 0

    def _read_stamp(self) -> tuple[int, ...]:
        # Inode too: a mounted Secret is updated by swapping a symlink, not by rewriting.
        c, k = os.stat(self.cert_file), os.stat(self.key_file)
        return c.st_mtime_ns, c.st_size, c.st_ino, k.st_mtime_ns, k.st_size, k.st_ino

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
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
            self.context.load_cert_chain(cert, key)

    async def watch(self, every_s: float = 10.0) -> None:
        while True:
            await asyncio.sleep(every_s)
            self.reload_if_changed()
