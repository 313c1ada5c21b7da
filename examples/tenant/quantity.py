"""Kubernetes resource quantities (``500m``, ``8Gi``, ``1e3``) as exact fractions."""

from __future__ import annotations

import re
from fractions import Fraction

_SUFFIXES = {
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": Fraction(1),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18),
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
    "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}
_QUANTITY = re.compile(r"^([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(?:[eE]([+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?)$")


def parse_quantity(text) -> Fraction:
    """The value of a quantity; raises ``ValueError`` naming the text if it is not one."""
    if isinstance(text, int):
        return Fraction(text)
    m = _QUANTITY.match(str(text).strip())
    if not m:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (for example 500m, 2, 8Gi)")
    number, exponent, suffix = m.groups()
    value = Fraction(number)
    if exponent is not None:
        return value * Fraction(10) ** int(exponent)
    return value * _SUFFIXES[suffix or ""]
