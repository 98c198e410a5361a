"""hash_tensor / HashMode: strength, order, dtype/shape sensitivity, layouts."""

from __future__ import annotations

import pytest
import torch

from numvar.determinism import HashMode, compare_sequences, hash_tensor, hash_value

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.uint16, torch.uint32, torch.uint64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64, torch.complex64, torch.complex128,
          torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_hashes_content_dtype_and_shape(dtype):
    base = torch.arange(12, dtype=torch.int64) % 2 if dtype == torch.bool else torch.arange(12)
    t = base.to(dtype).reshape(3, 4)
    h = hash_tensor(t)
    assert len(h) == 32 and h == hash_tensor(t.clone())
    assert hash_tensor(t.reshape(4, 3)) != h            # shape
    assert hash_tensor(base.reshape(3, 4).flip(-1).to(dtype)) != h                # order of the same elements
    other = torch.int16 if dtype != torch.int16 else torch.int32
    if dtype.is_complex:
        other = torch.complex128 if dtype == torch.complex64 else torch.complex64
    assert hash_tensor(t.to(other)) != h               # dtype
    u = t.clone()
    u.view(-1).view(torch.uint8)[5] ^= 1                # one flipped bit
    assert hash_tensor(u) != h
    assert hash_tensor(t.t()) == hash_tensor(t.t().contiguous())  # strides do not count


def test_empty_tensors_and_scalars():
    assert hash_tensor(torch.zeros(0, 3)) != hash_tensor(torch.zeros(3, 0))
    assert hash_tensor(torch.zeros(0)) != hash_tensor(torch.zeros(0, dtype=torch.float64))
    assert hash_tensor(torch.tensor(1.0)) != hash_tensor(torch.tensor([1.0]))


def test_non_contiguous_views_conj_and_neg_bits():
    x = torch.randn(6, 8)
    v = x[1::2, ::3]
    assert hash_tensor(v) == hash_tensor(v.contiguous())
    c = torch.randn(5, dtype=torch.complex64)
    assert hash_tensor(c.conj()) == hash_tensor(c.conj().resolve_conj())
    assert hash_tensor(c.conj()) != hash_tensor(c)
    assert hash_tensor(torch.ones(3).expand(4, 3)) == hash_tensor(torch.ones(4, 3))


def test_signed_zero_and_nan_payload_change_the_hash():
    assert hash_tensor(torch.tensor([0.0])) != hash_tensor(torch.tensor([-0.0]))
    a = torch.tensor([float("nan")])
    b = (a.view(torch.int32) + 1).view(torch.float32)
    assert b.isnan().all() and hash_tensor(a) != hash_tensor(b)
    assert hash_value(0.0) != hash_value(-0.0) and hash_value(1) != hash_value(1.0)


def test_sparse_tensors_hash_indices_and_values():
    i = torch.tensor([[0, 1, 2], [2, 0, 1]])
    s = torch.sparse_coo_tensor(i, torch.tensor([1.0, 2.0, 3.0]), (3, 3))
    s2 = torch.sparse_coo_tensor(i, torch.tensor([1.0, 2.0, 4.0]), (3, 3))
    s3 = torch.sparse_coo_tensor(i[:, [1, 0, 2]], torch.tensor([2.0, 1.0, 3.0]), (3, 3))
    assert hash_tensor(s) == hash_tensor(s.clone())
    assert hash_tensor(s) != hash_tensor(s2)
    assert hash_tensor(s) != hash_tensor(s3)  # same matrix, other index order
    assert hash_tensor(s) != hash_tensor(s.to_dense())
    csr = s.to_dense().to_sparse_csr()
    assert hash_tensor(csr) == hash_tensor(s.to_dense().to_sparse_csr())
    assert hash_tensor(csr) != hash_tensor(s2.to_dense().to_sparse_csr())
    assert hash_tensor(csr) != hash_tensor(s.to_dense().to_sparse_csc())


def test_hash_mode_empty_ops_not_hashed_and_inplace_hashed():
    with HashMode() as hm:
        e = torch.empty(5)
        e.fill_(2.0)
        torch.empty_like(e)
        a = torch.zeros(3)
        torch._foreach_add_([a], 1.0)
    ops = [(r.op, r.hash is None) for r in hm.records]
    assert ops == [("aten.empty.memory_format", True), ("aten.fill_.Scalar", False),
                   ("aten.empty_like.default", True), ("aten.zeros.default", False),
                   ("aten._foreach_add_.Scalar", False)]
    # The foreach op returns nothing; its hash covers the written tensor.
    with HashMode() as hm2:
        b = torch.zeros(3)
        torch._foreach_add_([b], 2.0)
    assert hm2.records[1].hash != hm.records[4].hash
    assert hm.records[4].outputs == [{"dtype": "float32", "shape": [3]}]


def test_compare_sequences_reports_hash_op_extra_missing():
    def rec(scale, extra=False):
        with HashMode() as hm:
            x = torch.ones(3) * scale
            y = x + 1
            if extra:
                y.exp()
        return hm.records

    a, b, c = rec(1.0), rec(2.0), rec(1.0, extra=True)
    assert compare_sequences(a, rec(1.0)) == []
    ds = compare_sequences(a, b)
    assert [(d.kind, d.index) for d in ds] == [("hash", 1), ("hash", 2)]
    assert [(d.kind, d.op) for d in compare_sequences(a, c)] == [("extra", "aten.exp.default")]
    assert [(d.kind, d.reference_op) for d in compare_sequences(c, a)] == [
        ("missing", "aten.exp.default")]
