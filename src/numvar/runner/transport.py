"""One realization's result as bytes: safetensors tensors plus a JSON record.

Workers (local processes, Dask tasks) return these bytes; the client stores them.
The record travels in the safetensors header metadata (key ``numvar``), so a blob is
a valid safetensors file and nothing in it is ever unpickled.
"""

from __future__ import annotations

import json
import re
import struct
from typing import Any

import torch

from ..errors import StoreError

_META_KEY = "numvar"


def pack(tensors: dict[str, torch.Tensor], info: dict[str, Any]) -> bytes:
    """Serialize captures and their record (JSON-able dict) to bytes."""
    from safetensors.torch import save

    flat = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    return save(flat, metadata={_META_KEY: json.dumps(info, default=str)})


def unpack(data: bytes) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Inverse of :func:`pack`. Raises StoreError on a malformed blob."""
    from safetensors.torch import load

    try:
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        info = json.loads(header.get("__metadata__", {}).get(_META_KEY, "{}"))
        tensors = load(data)
        order = info.get("kinds") or {}
        if order:  # safetensors stores by alignment: restore capture order
            tensors = {k: tensors[k] for k in order if k in tensors} | {
                k: v for k, v in tensors.items() if k not in order}
    except Exception as exc:  # struct, json and safetensors errors alike
        raise StoreError(f"malformed realization result ({len(data)} bytes): {exc}") from exc
    return tensors, info


# A float as printed by Python, numpy or torch: has a '.', an exponent, or is nan/inf.
# Not glued to letters, digits or dots on either side (so 'v1.2.3', 'r0001', 'info' and
# 'nanoseconds' give nothing); a sentence-ending '.' after the number is allowed.
_NUMBER = re.compile(
    r"(?<![\w.])[-+]?(?:(?:\d+\.\d*|\.\d+)(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|"
    r"(?:nan|inf(?:inity)?))(?!\w|\.\d)",
    re.IGNORECASE,
)


def stdout_numbers(text: str) -> list[float]:
    """The floating-point numbers in ``text``, by position (integers are not included)."""
    return [float(m.group(0)) for m in _NUMBER.finditer(text)]
