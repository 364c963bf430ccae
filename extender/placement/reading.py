"""Reading a user's file: bounded, decoded as text, parsed without surprises, one-line errors.

Every file a command reads (cluster and gang files, trace files, ``nvidia-smi topo -m``
matrices, a Workload object, a kubelet configuration) comes through here, so that no file,
whether binary, in another encoding, enormous, nested 10,000 levels deep or a YAML alias bomb
("billion laughs"), gets further than a :class:`FileError` whose one-line message names the
file and the problem. The bounds, the same for every format:

- :data:`MAX_FILE_BYTES`: at most 16 MiB is read; a larger file (or ``/dev/zero``) is refused.
- Text is UTF-8; a byte-order mark selects UTF-8 or UTF-16 (what Windows tools write). A NUL
  byte marks a binary file.
- :data:`MAX_DEPTH`: YAML and JSON values nest at most 64 levels deep (the deepest real file,
  a Workload's pod template, nests about 15), counted with aliases followed.
- :data:`MAX_VALUES`: a YAML document holds at most 1,000,000 values, counted as written and
  again with its aliases expanded: aliases cost nothing to parse, so nine nested anchors of
  nine aliases each read as 387 million values, which would otherwise be validated one by
  one. An alias to the value it sits in is refused too. (PyYAML reads some 50,000 values a
  second, so this bound is also what keeps the worst file to seconds.) A line of JSON holds
  as many.
- :data:`MAX_NUMBER_CHARS`: a number is written in at most 100 characters (Python would
  read a longer whole number slowly, or refuse one of more than 4,300 digits).

Each file format then sets bounds on its own values (pods, nodes, seconds): see
:mod:`extender.placement.files` and :mod:`extender.sim.trace`.
"""

from __future__ import annotations

import codecs
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import yaml

__all__ = [
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "MAX_NUMBER_CHARS",
    "MAX_VALUES",
    "FileError",
    "check_shape",
    "decode",
    "load_json",
    "load_yaml",
    "parse_yaml",
    "read_stream",
    "read_text",
    "shown",
]

MAX_FILE_BYTES = 16 * 2**20
MAX_DEPTH = 64
MAX_VALUES = 1_000_000
MAX_NUMBER_CHARS = 100

_BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


#: Line breaks and other control characters, as they would be escaped in Python.
_ESCAPED = {c: repr(chr(c))[1:-1] for c in (*range(0x20), 0x7F, 0x85, 0x2028, 0x2029)}


class FileError(ValueError):
    """A file that cannot be used; the message names the file, the field and the problem.

    The message is one line whatever the file holds: a line break in a name or a key, or in
    the file's own name, is shown escaped (``\\n``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message.translate(_ESCAPED))


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


# -- bytes to text ----------------------------------------------------------------------


def decode(data: bytes, where: str) -> str:
    """``data`` as text: UTF-8, or what its byte-order mark says; a NUL byte or bytes that are
    not UTF-8 are refused with their offset."""
    encoding = next((enc for bom, enc in _BOMS if data.startswith(bom)), "utf-8")
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        byte = data[exc.start : exc.start + 1].hex()
        raise FileError(
            f"{where}: not UTF-8 text (byte 0x{byte} at offset {exc.start}); save it as UTF-8"
        ) from None
    nul = text.find("\0")
    if nul >= 0:
        raise FileError(f"{where}: a binary file, not text (a NUL character at offset {nul})")
    return text


def _too_large(where: str) -> FileError:
    return FileError(f"{where}: larger than {MAX_FILE_BYTES // 2**20} MiB, the most gangslice reads")


def read_text(path: str | Path) -> str:
    """The text of ``path``: at most :data:`MAX_FILE_BYTES`, decoded by :func:`decode`."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise FileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise _too_large(str(path))
    return decode(data, str(path))


def read_stream(stream: IO[Any], where: str) -> str:
    """The text of an open stream (stdin), bounded and decoded as :func:`read_text`'s."""
    binary = getattr(stream, "buffer", None)
    try:
        data = binary.read(MAX_FILE_BYTES + 1) if binary is not None else stream.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise FileError(f"{where}: cannot read: {exc.strerror or exc}") from None
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    if len(data) > MAX_FILE_BYTES:
        raise _too_large(where)
    return decode(data, where)


# -- YAML -------------------------------------------------------------------------------


class _Bound(Exception):
    """A bound of this module reached while composing: the problem, and where."""

    def __init__(self, problem: str, mark: yaml.Mark | None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.mark = mark


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader (the pure-Python one, whose composer can be bounded) that refuses
    to compose a node deeper than :data:`MAX_DEPTH` before recursing into it, and a number
    longer than :data:`MAX_NUMBER_CHARS` before reading it."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._values = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        self._values += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Bound(_too_deep(), self.peek_event().start_mark)  # type: ignore[no-untyped-call]
            if self._values > MAX_VALUES:
                raise _Bound(_too_many(), self.peek_event().start_mark)  # type: ignore[no-untyped-call]
            return super().compose_node(parent, index)  # type: ignore[no-any-return]
        finally:
            self._depth -= 1

    def _short(self, node: yaml.ScalarNode) -> None:
        if len(node.value) > MAX_NUMBER_CHARS:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"a number of {len(node.value)} characters; at most {MAX_NUMBER_CHARS}",
                node.start_mark,
            )

    def _int(self, node: yaml.ScalarNode) -> int:
        self._short(node)
        return self.construct_yaml_int(node)

    def _float(self, node: yaml.ScalarNode) -> float:
        self._short(node)
        return self.construct_yaml_float(node)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader._int)
_Loader.add_constructor("tag:yaml.org,2002:float", _Loader._float)


def _too_deep() -> str:
    return f"values nested deeper than {MAX_DEPTH} levels"


def _too_many() -> str:
    return f"more than {MAX_VALUES:,} values, aliases expanded"


def _children(node: yaml.Node) -> Iterator[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        yield from node.value
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            yield key
            yield value


def _line(node: yaml.Node) -> str:
    return f" line {node.start_mark.line + 1}:" if node.start_mark is not None else ""


def _check_graph(root: yaml.Node, where: str) -> None:
    """The composed document, aliases followed, within :data:`MAX_DEPTH` and :data:`MAX_VALUES`.

    An alias is the very node its anchor names, so each node is measured once (its values and
    its depth, aliases expanded) and the walk costs what the file's size does, however far
    its aliases would expand. The walk keeps its own stack: alias chains may be long."""
    measured: dict[int, tuple[int, int]] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            open_nodes.discard(key)
            sizes = [measured[id(c)] for c in _children(node)]
            values = 1 + sum(v for v, _ in sizes)
            depth = 1 + max((d for _, d in sizes), default=0)
            if depth > MAX_DEPTH:
                raise FileError(f"{where}:{_line(node)} {_too_deep()} (aliases followed)")
            if values > MAX_VALUES:
                raise FileError(f"{where}:{_line(node)} {_too_many()} (a YAML alias bomb?)")
            measured[key] = (values, depth)
            continue
        if key in measured:
            continue
        if key in open_nodes:
            raise FileError(f"{where}:{_line(node)} an alias refers to the value it sits in")
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in measured)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.reader.ReaderError):
        return f" character {exc.position}: {exc.reason} (#x{exc.character:04x})"
    mark = getattr(exc, "problem_mark", None)
    at = f" line {mark.line + 1}:" if mark is not None else ""
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or exc
    context = getattr(exc, "context", None)
    if problem is not context and isinstance(context, str) and context.startswith("expected"):
        problem = f"{context}, {problem}"  # "expected a single document in the stream, but found another"
    return f"{at} {_one_line(problem)}"


def parse_yaml(text: str, where: str) -> Any:
    """One YAML document's content, safe-loaded within the bounds of this module."""
    loader: _Loader | None = None
    try:
        loader = _Loader(text)  # refuses a character YAML does not allow (a control character)
        node = loader.get_single_node()
        if node is None:
            return None
        _check_graph(node, where)
        return loader.construct_document(node)
    except FileError:
        raise
    except _Bound as exc:
        at = f" line {exc.mark.line + 1}:" if exc.mark is not None else ""
        raise FileError(f"{where}:{at} {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise FileError(f"{where}: not valid YAML:{_yaml_problem(exc)}") from None
    except ValueError as exc:  # a date that is no date (2024-02-30)
        raise FileError(f"{where}: not valid YAML: {_one_line(exc)}") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml(path: str | Path) -> Any:
    """A YAML file's content: :func:`read_text`, then :func:`parse_yaml`."""
    return parse_yaml(read_text(path), str(path))


# -- JSON and plain data ----------------------------------------------------------------


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _json_number(kind: type[int] | type[float]) -> Any:
    def read(text: str) -> int | float:
        if len(text) > MAX_NUMBER_CHARS:
            raise ValueError(f"a number of {len(text)} characters; at most {MAX_NUMBER_CHARS}")
        return kind(text)

    return read


def check_shape(data: Any, where: str) -> None:
    """Plain data (parsed JSON) within :data:`MAX_DEPTH` and :data:`MAX_VALUES`."""
    values = 0
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        values += 1
        if depth > MAX_DEPTH:
            raise FileError(f"{where}: {_too_deep()}")
        if values > MAX_VALUES:
            raise FileError(f"{where}: more than {MAX_VALUES:,} values")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


def load_json(text: str, where: str) -> Any:
    """One JSON value, within the bounds of this module; ``NaN`` and ``Infinity``, which
    Python's reader takes but JSON has not, are refused."""
    try:
        data = json.loads(
            text, parse_constant=_no_constant, parse_int=_json_number(int), parse_float=_json_number(float)
        )
    except json.JSONDecodeError as exc:
        raise FileError(f"{where}: not valid JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise FileError(f"{where}: {_too_deep()}") from None
    except ValueError as exc:  # a number too long; NaN
        raise FileError(f"{where}: not valid JSON: {_one_line(exc)}") from None
    check_shape(data, where)
    return data


def shown(value: Any, width: int = 60) -> str:
    """A value read from a file, for an error message: on one line and short (a 4,000-digit
    number or a list of a million values is not worth printing)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"a number of {value.bit_length()} bits"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict | list) and len(value) > width:
        return f"a {type(value).__name__} of {len(value)} values"
    text = _one_line(repr(value))
    return text if len(text) <= width else f"{text[: width - 3]}..."
