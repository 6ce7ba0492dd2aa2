"""Length bucketing (rulegraph.scale.batches)."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rulegraph.scale import batches


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 600), max_size=80), st.integers(1, 12), st.integers(16, 20000))
def test_every_example_once_within_the_limits(lengths, batch, budget):
    groups = batches(lengths, batch, budget)
    flat = [i for g in groups for i in g]
    assert sorted(flat) == list(range(len(lengths)))
    for g in groups:
        assert 1 <= len(g) <= batch
        assert len(g) == 1 or len(g) * max(lengths[i] for i in g) <= budget // 4


def test_sorted_by_length_inside_windows_and_in_file_order_across_them():
    lengths = [5, 1, 4, 2, 9, 8, 7, 6]
    groups = batches(lengths, batch=2, batch_tokens=10**6, window=2)    # windows of 4 examples
    assert groups == [[1, 3], [2, 0], [7, 6], [5, 4]]


def test_the_token_budget_splits_long_examples():
    assert batches([100, 100, 100], batch=8, batch_tokens=800) == [[0, 1], [2]]
