"""Kubernetes quantities as numbers ("500m" is 0.5, "2Gi" is 2**31): what the builders compare and
divide (a fetch's resources, a front's share of the CPU). Pure, and at the bottom of the core so
that an engine's pod part can read one as the shared pod's builders do."""

from __future__ import annotations

import re
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal, localcontext

_SUFFIXES = {
    **{s: Decimal(1000) ** (i + 1) for i, s in enumerate("kMGTPE")},
    **{f"{s}i": Decimal(1024) ** (i + 1) for i, s in enumerate("KMGTPE")},
    **{"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1)},
}
_EXPONENT_BOUND = 10**9
_QUANTITY = re.compile(r"^\+?([0-9.]+)((?:[eE][+-]?[0-9]+)?)([A-Za-z]*)$")


def quantity_value(quantity: str) -> Decimal:
    """The number a Kubernetes quantity stands for ("500m" is 0.5, "2Gi" is 2**31); the schema
    has already checked its form."""
    match = _QUANTITY.match(quantity.strip())
    if match is None or match.group(3) not in _SUFFIXES:
        raise ValueError(f"not a quantity: {quantity!r}")
    number, exponent, suffix = match.groups()
    # The schema lets an exponent be as long as its digits go ("1e2000000000000000000", past
    # even Decimal's largest): such a value only has to compare as huge or tiny, which an
    # exponent of a billion does. Zero stays zero (".0e2000000000000000000").
    power = max(-_EXPONENT_BOUND, min(_EXPONENT_BOUND, int(exponent[1:]))) if exponent else 0
    with localcontext(Context(prec=28, Emax=MAX_EMAX, Emin=MIN_EMIN)):
        return Decimal(number).scaleb(power) * _SUFFIXES[suffix]
