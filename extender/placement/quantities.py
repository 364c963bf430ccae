"""Kubernetes resource quantities (``500m``, ``64Gi``, ``1.5``, ``2e3``) as exact numbers.

The grammar and the rounding are those of k8s.io/apimachinery ``resource.Quantity``: a signed
decimal number, then a binary-SI suffix (``Ki`` .. ``Ei``), a decimal-SI suffix (``n``, ``u``,
``m``, ``k``, ``M``, ``G``, ``T``, ``P``, ``E``) or a decimal exponent (``e3``, ``E-2``).
``Value()`` and ``MilliValue()`` round up, so a pod asking for ``0.1m`` CPU counts 1
millicore, as kube-scheduler counts it. Both must fit the 64-bit integer Kubernetes keeps them
in (:data:`MAX_INT64`); a number of more than :data:`MAX_DIGITS` digits is refused unread.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from extender.placement.reading import shown

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
#: What ``Value()`` and ``MilliValue()`` return at most (Kubernetes keeps them in an int64).
MAX_INT64 = 2**63 - 1
#: Digits of a quantity's number; an int64 has 19, a fraction a few more.
MAX_DIGITS = 64
_NUMBER = re.compile(r"([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(.*)", re.ASCII)
_EXPONENT = re.compile(r"[eE]([+-]?[0-9]+)", re.ASCII)


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity (or is negative where it must not be)."""


def parse(value: object) -> Fraction:
    """A quantity as an exact number; a YAML/JSON number is taken as written."""
    if isinstance(value, bool):
        raise QuantityError(f"{shown(value)} is not a quantity")
    if isinstance(value, int | Fraction):
        if isinstance(value, int) and value.bit_length() > 64:
            raise QuantityError(
                f"a number of {value.bit_length()} bits: more than Kubernetes keeps (at most {MAX_INT64})"
            )
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"{shown(value)} is not a quantity")
        return Fraction(str(value))
    if not isinstance(value, str):
        raise QuantityError(f"{shown(value)} is not a quantity")
    m = _NUMBER.fullmatch(value)
    if m is None:
        raise QuantityError(
            f"{shown(value)} is not a quantity (a number with an optional suffix such as m, Gi, G)"
        )
    sign, digits, suffix = m.groups()
    if len(digits) > MAX_DIGITS:
        raise QuantityError(f"{shown(value, 30)}: more than {MAX_DIGITS} digits")
    number = Fraction(digits if not digits.endswith(".") else digits[:-1] or "0")
    if sign == "-":
        number = -number
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    e = _EXPONENT.fullmatch(suffix)
    if e is not None and abs(int(e.group(1))) <= 30:
        return number * Fraction(10) ** int(e.group(1))
    raise QuantityError(
        f"{shown(value)}: unknown suffix {shown(suffix)} (known: Ki..Ei, n, u, m, k, M, G, T, P, E, e<n>)"
    )


def _non_negative(value: object) -> Fraction:
    got = parse(value)
    if got < 0:
        raise QuantityError(f"{shown(value)} is negative")
    return got


def _int64(value: object, got: int, unit: str) -> int:
    if got > MAX_INT64:
        raise QuantityError(f"{shown(value)} is larger than Kubernetes keeps (at most {MAX_INT64} {unit})")
    return got


def milli(value: object) -> int:
    """``MilliValue()``: thousandths, rounded up (CPU: ``500m`` -> 500, ``2`` -> 2000)."""
    return _int64(value, math.ceil(_non_negative(value) * 1000), "thousandths")


def whole(value: object) -> int:
    """``Value()``: a whole count, rounded up (memory: ``1Gi`` -> 1073741824 bytes)."""
    return _int64(value, math.ceil(_non_negative(value)), "units")
