"""Structured logs: the gang and reservation travel as fields, in JSON or as key=value."""

from __future__ import annotations

import json
import logging

import pytest

from extender.logs import JsonFormatter, TextFormatter, configure, fields


def _record(**extra: object) -> logging.LogRecord:
    record = logging.LogRecord(
        "extender.kube.cache", logging.INFO, __file__, 1, "reserved %d pods", (4,), None
    )
    for k, v in extra.items():
        setattr(record, k, v)
    return record


def test_json_lines_carry_the_gang_and_reservation() -> None:
    line = JsonFormatter().format(_record(**fields(gang="llm/llama", reservation="llm/llama", pod=None)))
    got = json.loads(line)
    assert got["msg"] == "reserved 4 pods"
    assert got["level"] == "info" and got["logger"] == "extender.kube.cache"
    assert got["gang"] == "llm/llama" and got["reservation"] == "llm/llama"
    assert "pod" not in got


def test_text_lines_append_the_fields() -> None:
    line = TextFormatter().format(_record(gang="llm/llama"))
    assert line.endswith("extender.kube.cache: reserved 4 pods gang=llm/llama")


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="expected one of text, json"):
        configure("info", "yaml")
