# SPDX-License-Identifier: Apache-2.0
"""Kubernetes resource quantities (`500m`, `2`, `64Mi`, `1G`) as Slurm wants them."""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

_SUFFIX = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_RE = re.compile(r"^([+]?[0-9.]+(?:[eE][-+]?[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


class QuantityError(ValueError):
    """A quantity Kubernetes would not have accepted either."""


def parse(text: str | int | float) -> Decimal:
    """A quantity's value in base units (cores, bytes)."""
    m = _RE.match(str(text).strip())
    if not m:
        raise QuantityError(f"not a Kubernetes quantity: {text!r}")
    try:
        value = Decimal(m.group(1))
    except InvalidOperation as e:
        raise QuantityError(f"not a Kubernetes quantity: {text!r}") from e
    suffix = m.group(2) or ""
    if suffix == "m":
        return value / 1000
    return value * _SUFFIX[suffix]


def cpus(text: str | int | float) -> int:
    """Whole CPUs for `--cpus-per-task` (Slurm allocates whole CPUs: 500m -> 1)."""
    return max(1, math.ceil(parse(text)))


def mebibytes(text: str | int | float) -> int:
    """MiB for `--mem` (rounded up: Slurm's unit is the MiB)."""
    return max(1, math.ceil(parse(text) / 2**20))
