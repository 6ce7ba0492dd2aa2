"""``rows_matmul``: the VJP of a product with a weight matrix skips the cotangent's all-zero rows."""
from __future__ import annotations

import pytest
import torch

from rulegraph.ops import linalg
from rulegraph.ops.linalg import rows_matmul


@pytest.fixture
def small_threshold(monkeypatch):
    monkeypatch.setattr(linalg, "SPARSE_ROWS_FROM", 1)


def _seed(positions: int, vocabulary: int, rows: dict[int, dict[int, float]], dtype=torch.float64):
    g = torch.zeros(1, positions, vocabulary, dtype=dtype)
    for p, entries in rows.items():
        for v, x in entries.items():
            g[0, p, v] = x
    return g


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_hot_and_contrast_rows_give_the_full_products_bits(small_threshold, dtype):
    """One or two non-zero entries per row: one or two terms, so any summation order gives these bits."""
    w = torch.randn(50, 16, dtype=dtype)
    for rows in ({9: {7: 1.0}}, {9: {7: 1.0, 3: -1.0}}, {0: {1: 1.0}, 9: {2: 1.0}}):
        g = _seed(10, 50, rows, dtype)
        out = rows_matmul(g, w)
        assert torch.equal(out, torch.matmul(g, w))
        assert not out[0, [p for p in range(10) if p not in rows]].any()


def test_dense_rows_are_the_product_and_a_dense_cotangent_is_not_split(small_threshold):
    w = torch.randn(50, 16, dtype=torch.float64)
    g = _seed(10, 50, {4: {}})
    g[0, 4] = torch.randn(50, dtype=torch.float64)
    torch.testing.assert_close(rows_matmul(g, w), torch.matmul(g, w), rtol=1e-13, atol=0)
    dense = torch.randn(1, 10, 50, dtype=torch.float64)
    assert torch.equal(rows_matmul(dense, w), torch.matmul(dense, w))


def test_a_nan_row_is_multiplied_not_skipped(small_threshold):
    w = torch.randn(50, 16, dtype=torch.float64)
    g = _seed(10, 50, {9: {7: 1.0}})
    g[0, 2, 5] = float("nan")
    out = rows_matmul(g, w)
    assert out[0, 2].isnan().all() and torch.equal(out[0, 9], w[7])


def test_small_cotangents_and_activation_products_take_the_plain_product():
    g = _seed(10, 50, {9: {7: 1.0}})
    w = torch.randn(50, 16, dtype=torch.float64)
    assert torch.equal(rows_matmul(g, w), torch.matmul(g, w))      # below SPARSE_ROWS_FROM
    b = torch.randn(1, 50, 16, dtype=torch.float64)                 # a batched operand: not a weight
    assert torch.equal(rows_matmul(g, b), torch.matmul(g, b))
