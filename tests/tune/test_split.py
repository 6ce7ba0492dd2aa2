"""The split once: deterministic under its seed, independent of the file's order, a repeated text in
one part, every part non-empty, recorded."""
from __future__ import annotations

import csv
import json

import pytest

from rulegraph.errors import InputError
from rulegraph.tune import split as S

RECORDS = [{"text": f"text number {i}", "label": i % 2} for i in range(50)]


def test_the_same_seed_gives_the_same_split_and_another_seed_another():
    a, b = S.split(RECORDS, 7), S.split(RECORDS, 7)
    assert a.parts == b.parts
    assert S.split(RECORDS, 8).parts != a.parts
    assert a.sizes() == {"tune": 30, "validation": 10, "test": 10}
    assert sorted(i for ix in a.parts.values() for i in ix) == list(range(50))


def test_the_split_follows_the_texts_not_their_order_in_the_file():
    shuffled = RECORDS[::-1]
    a, b = S.split(RECORDS, 3), S.split(shuffled, 3)
    for part in S.PARTS:
        assert {RECORDS[i]["text"] for i in a.parts[part]} == {shuffled[i]["text"] for i in b.parts[part]}


def test_a_part_is_the_texts_lowest_in_the_hash_order():
    a = S.split(RECORDS, 0)
    order = sorted(range(50), key=lambda i: S.key(RECORDS[i]["text"], 0))
    assert sorted(a.parts["tune"]) == sorted(order[:30])
    assert sorted(a.parts["test"]) == sorted(order[40:])


def test_a_repeated_text_stays_in_one_part():
    records = RECORDS[:10] + [dict(RECORDS[3]), dict(RECORDS[3])]
    parts = S.split(records, 1).parts
    holding = [p for p, ix in parts.items() if {3, 10, 11} & set(ix)]
    assert len(holding) == 1 and {3, 10, 11} <= set(parts[holding[0]])


def test_three_texts_make_three_parts_and_two_are_refused():
    assert S.split(RECORDS[:3], 0).sizes() == {"tune": 1, "validation": 1, "test": 1}
    with pytest.raises(InputError, match="2 distinct texts; .* needs at least 3"):
        S.split(RECORDS[:2] + RECORDS[:2], 0)


def test_fractions_are_read_as_shares_and_bad_ones_refused():
    assert S.fractions("60,20,20") == pytest.approx((0.6, 0.2, 0.2))
    assert S.fractions("1,1,2") == pytest.approx((0.25, 0.25, 0.5))
    assert S.split(RECORDS, 0, S.fractions("1,1,2")).sizes() == {"tune": 12, "validation": 12, "test": 26}
    for bad in ("60,40", "a,b,c", "60,0,40"):
        with pytest.raises(InputError, match="--split"):
            S.fractions(bad)


def test_the_split_is_recorded_with_each_part_s_records(tmp_path):
    data = tmp_path / "d.csv"
    with data.open("w", newline="") as handle:
        csv.writer(handle).writerows([["text", "label"], *[[r["text"], r["label"]] for r in RECORDS[:9]],
                                      ["", 1]])       # a record without text is not split
    records = S.read_records(data)
    assert len(records) == 9
    split = S.split(records, 0)
    paths = split.write(tmp_path / "out")
    lines = (tmp_path / "out" / "split.csv").read_text().splitlines()
    assert lines[0] == "record,part" and len(lines) == 10
    for part, path in paths.items():
        written = [json.loads(line) for line in path.read_text().splitlines()]
        assert written == [records[i] for i in split.parts[part]]


def test_a_text_with_line_separators_of_unicode_is_read_back_whole(tmp_path):
    """A review may hold U+0085 (NEL), U+2028 or U+2029, which str.splitlines() ends a line at: the parts are
    written with ASCII escapes, so each record stays one line and the evaluation reads it whole."""
    from rulegraph.scale.data import READERS
    records = [{"text": f"review {i}\x85second line\u2028third\u2029é", "label": i % 2} for i in range(9)]
    split = S.split(records, 0)
    for part, path in split.write(tmp_path).items():
        assert [r for _, r in READERS[".jsonl"](path)] == [records[i] for i in split.parts[part]]
