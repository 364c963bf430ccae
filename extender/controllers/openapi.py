"""Validate objects against a CRD's structural OpenAPI v3 schema with ``jsonschema``.

Used by tests and conformance checks (``jsonschema`` is a test dependency, imported lazily).
Differences from JSON Schema are bridged: ``nullable: true`` admits null, ``format:
date-time`` is checked (RFC 3339), and RE2 patterns with inline flags after ``^`` are
rewritten for Python's ``re``. ``x-kubernetes-*`` keys and CEL rules are
ignored, as a JSON Schema validator does with unknown keywords.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml


class SchemaError(ValueError):
    """An object that does not match the schema; the message lists each failing path."""


def load_crd(path: str | Path) -> dict[str, Any]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader reads Kueue's 19k-line CRD fast
    docs = [d for d in yaml.load_all(Path(path).read_text(), Loader=loader) if d]
    crds = [d for d in docs if d.get("kind") == "CustomResourceDefinition"]
    if len(crds) != 1:
        raise ValueError(f"{path}: expected one CustomResourceDefinition, found {len(crds)}")
    crd: dict[str, Any] = crds[0]
    return crd


def version_schema(crd: Mapping[str, Any], version: str) -> dict[str, Any]:
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            schema: dict[str, Any] = v["schema"]["openAPIV3Schema"]
            return schema
    raise KeyError(f"{crd['metadata']['name']}: no version {version}")


def to_json_schema(schema: Any) -> Any:
    """A copy of an OpenAPI v3 schema where ``nullable: true`` also admits null."""
    if isinstance(schema, list):
        return [to_json_schema(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {k: to_json_schema(v) for k, v in schema.items() if k != "nullable"}
    if isinstance(out.get("pattern"), str):
        out["pattern"] = _python_pattern(out["pattern"])
    if schema.get("nullable") is True:
        if "type" in out:
            out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


_LEADING_FLAGS = re.compile(r"^\^(\(\?[a-zA-Z]+\))")


def _python_pattern(pattern: str) -> str:
    """Go's RE2 takes ``^(?i)...``; Python wants global flags first: ``(?i)^...``."""
    m = _LEADING_FLAGS.match(pattern)
    return f"{m.group(1)}^{pattern[m.end() :]}" if m else pattern


def _rfc3339(value: object) -> bool:
    if not isinstance(value, str) or "T" not in value.upper():
        return False
    try:
        datetime.fromisoformat(value.replace("z", "Z"))
    except ValueError:
        return False
    return True


def validator(schema: Mapping[str, Any]) -> Any:
    import jsonschema

    checker = jsonschema.FormatChecker()
    checker.checks("date-time")(_rfc3339)
    return jsonschema.Draft7Validator(to_json_schema(schema), format_checker=checker)


def validate(schema: Mapping[str, Any], obj: Any, what: str = "object") -> None:
    errors = sorted(validator(schema).iter_errors(obj), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}" for e in errors[:10]]
        raise SchemaError(f"{what} does not match its schema:\n  " + "\n  ".join(lines))
