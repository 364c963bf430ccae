"""Logging set-up shared by the long-running commands (``serve``, ``agent``).

``--log-format json`` writes one JSON object per line with ``ts``, ``level``, ``logger`` and
``msg``, plus the structured fields a call site passes with ``extra=`` (``gang``,
``reservation``, ``node``, ``pod``, ...), so a log pipeline can follow one gang through the
extender, the ledger and the controllers. ``text`` keeps the usual one-line form and
appends the same fields as ``key=value``.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

FORMATS = ("text", "json")
#: Fields a call site may pass with ``extra=``; they are written when present.
FIELDS = ("gang", "reservation", "pod", "node", "podgroup", "workload", "verb")


def fields(**values: Any) -> dict[str, Any]:
    """``extra=`` for a log call: the structured fields that are set."""
    return {k: v for k, v in values.items() if v is not None}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: getattr(record, k) for k in FIELDS if getattr(record, k, None) is not None}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_extras(record),
        }
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = _extras(record)
        if extra:
            line += " " + " ".join(f"{k}={v}" for k, v in extra.items())
        return line


def configure(level: str = "info", fmt: str = "text") -> None:
    """Install one stderr handler on the root logger (replacing earlier ones)."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: expected one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
