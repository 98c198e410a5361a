"""Bit-level views, strong hashes and bitwise comparison of tensors and plain values.

Hashes are xxh3-128 over a header (kind, layout, dtype, shape) followed by the tensor's
logical content in C order as raw bytes (so a permutation, a reshape or a dtype change
gives a different hash, strides do not). Comparisons are on raw bits: -0.0 differs from
+0.0 and NaNs with different payloads differ.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import torch
import xxhash

__all__ = ["hash_tensor", "hash_value", "bits", "TensorDiff", "diff_tensors", "values_equal",
           "describe"]

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_SPARSE_COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


def _dense_bytes(t: torch.Tensor) -> memoryview:
    """The logical content of a strided tensor as C-order bytes (copied to CPU)."""
    t = t.detach()
    if t.is_quantized:
        t = t.int_repr()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    t = t.contiguous().reshape(-1)
    if t.device.type != "cpu":
        t = t.cpu()
    return memoryview(t.view(torch.uint8).numpy()).cast("B")


def _header(h: Any, kind: str, t: torch.Tensor) -> None:
    h.update(f"{kind}|{t.layout}|{t.dtype}|{list(t.shape)}|".encode())


def _update(h: Any, t: torch.Tensor) -> None:
    layout = t.layout
    if layout == torch.sparse_coo:
        _header(h, "sparse", t)
        h.update(f"{t.sparse_dim()}|{t.dense_dim()}|{int(t.is_coalesced())}|".encode())
        _update(h, t._indices())
        _update(h, t._values())
    elif layout in _SPARSE_COMPRESSED:
        _header(h, "compressed", t)
        if layout in (torch.sparse_csr, torch.sparse_bsr):
            comp, plain = t.crow_indices(), t.col_indices()
        else:
            comp, plain = t.ccol_indices(), t.row_indices()
        _update(h, comp)
        _update(h, plain)
        _update(h, t.values())
    elif t.device.type == "meta":
        _header(h, "meta", t)  # no content to hash
    else:
        _header(h, "dense", t)
        if t.is_quantized:
            h.update(f"{t.qscheme()}|".encode())
            if t.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
                h.update(struct.pack("<dq", t.q_scale(), t.q_zero_point()))
            else:
                _update(h, t.q_per_channel_scales())
                _update(h, t.q_per_channel_zero_points())
                h.update(f"{t.q_per_channel_axis()}|".encode())
        if t.numel():
            h.update(_dense_bytes(t))


def hash_tensor(t: torch.Tensor) -> str:
    """xxh3-128 hex digest of dtype, shape, layout and logical content (bitwise)."""
    h = xxhash.xxh3_128()
    _update(h, t)
    return h.hexdigest()


def _value_token(v: Any) -> str:
    if isinstance(v, float):
        return "f:" + struct.pack("<d", v).hex()
    if isinstance(v, complex):
        return "c:" + struct.pack("<dd", v.real, v.imag).hex()
    if isinstance(v, bool) or v is None:
        return f"{type(v).__name__}:{v}"
    if isinstance(v, int):
        return f"i:{v}"
    if isinstance(v, (torch.dtype, torch.device, torch.layout, torch.memory_format, str)):
        return f"{type(v).__name__}:{v}"
    if isinstance(v, (torch.Size, tuple, list)):
        return f"{type(v).__name__}:[" + ",".join(_value_token(x) for x in v) + "]"
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return f"{type(v).__name__}:{v}"
    # Opaque objects (ScriptObject handles, ...): their repr holds addresses; type only.
    return f"{type(v).__module__}.{type(v).__qualname__}:opaque"


def hash_value(v: Any) -> str:
    """Hash of any leaf: tensors by :func:`hash_tensor`, floats by their bits, others by
    type and repr."""
    if isinstance(v, torch.Tensor):
        return hash_tensor(v)
    return xxhash.xxh3_128(_value_token(v).encode()).hexdigest()


def describe(v: Any) -> dict[str, Any]:
    """Small JSON-able description of a leaf (dtype and shape, or the type)."""
    if isinstance(v, torch.Tensor):
        return {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape)}
    return {"type": type(v).__name__}


def bits(t: torch.Tensor) -> torch.Tensor:
    """An integer view of a dense tensor with one integer per element's raw bits
    (complex128: two int64 per element along a trailing dim)."""
    t = t.detach()
    if t.is_quantized:
        return t.int_repr()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    size = t.element_size()
    if size == 16:  # complex128
        return torch.view_as_real(t).view(torch.int64)
    return t.view(_INT_OF_SIZE[size])


@dataclass
class TensorDiff:
    """How two tensors differ: shapes, dtypes, #differing elements, max |a-b|."""

    shapes: tuple[list[int], list[int]]
    dtypes: tuple[str, str]
    n_differing: int
    max_abs_diff: float
    note: str = ""


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    """max |a-b| over the differing elements; one NaN and one number count as inf,
    two NaNs (different payloads) and ±0 count as 0."""
    try:
        if a.is_complex():
            x, y = a[mask].to(torch.complex128), b[mask].to(torch.complex128)
            d = (x - y).abs()
            nx, ny = x.isnan(), y.isnan()
        else:
            x, y = a[mask].to(torch.float64), b[mask].to(torch.float64)
            d = (x - y).abs()
            nx, ny = x.isnan(), y.isnan()
        d = torch.where(nx & ny, torch.zeros_like(d), d)
        d = torch.where(nx ^ ny, torch.full_like(d, math.inf), d)
        d = torch.where(d.isnan(), torch.full_like(d, math.inf), d)  # inf - inf
        return float(d.max().item()) if d.numel() else 0.0
    except Exception:  # dtypes without arithmetic (sub-byte fp4 ...)
        return math.nan


def _dense_of(t: torch.Tensor) -> torch.Tensor:
    return t.to_dense() if t.layout != torch.strided else t


def diff_tensors(a: torch.Tensor, b: torch.Tensor) -> TensorDiff | None:
    """None when ``a`` and ``b`` are bitwise identical (dtype, shape, every bit), else the
    difference."""
    shapes = (list(a.shape), list(b.shape))
    dtypes = (str(a.dtype).replace("torch.", ""), str(b.dtype).replace("torch.", ""))
    if a.dtype != b.dtype or a.shape != b.shape or a.layout != b.layout:
        return TensorDiff(shapes, dtypes, -1, math.nan, "dtype, shape or layout differ")
    if a.device.type == "meta" or b.device.type == "meta":
        return None
    if a.layout != torch.strided:
        if hash_tensor(a) == hash_tensor(b):
            return None
        a, b = _dense_of(a), _dense_of(b)
        note = "sparse structure or values differ"
    else:
        note = ""
    if b.device != a.device:
        b = b.to(a.device)
    ba, bb = bits(a), bits(b)
    if torch.equal(ba, bb):
        return None if not note else TensorDiff(shapes, dtypes, 0, 0.0, note)
    ne = ba != bb
    if ne.dim() > a.dim():  # complex128: two words per element
        ne = ne.any(dim=-1)
    n = int(ne.sum().item())
    return TensorDiff(shapes, dtypes, n, _max_abs_diff(a.detach(), b.detach(), ne), note)


def values_equal(x: Any, y: Any) -> bool:
    """Equality of non-tensor outputs by value, floats by their bits."""
    return type(x) is type(y) and _value_token(x) == _value_token(y)
