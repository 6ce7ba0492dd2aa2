"""Reading a dataset file (rulegraph/scale/data.py): a JSON Lines file's lines end at "\\n" only, so a text
holding U+0085, U+2028 or U+2029 (IMDB reviews hold U+0085) is read whole, with the line numbers an editor
shows; a line ending in "\\r\\n" reads as one ending in "\\n"."""
from __future__ import annotations

import json

from rulegraph.scale.data import read_rows


def test_a_text_holding_unicode_line_separators_is_read_whole(tmp_path):
    texts = ["a\u0085b", "c\u2028d", "e\u2029f", "g"]
    lines = [json.dumps({"text": t, "label": i % 2}, ensure_ascii=False) for i, t in enumerate(texts)]
    path = tmp_path / "d.jsonl"
    path.write_bytes(("\n".join(lines[:3]) + "\r\n" + lines[3] + "\n").encode("utf-8"))
    rows = read_rows(path)
    assert [r.text for r in rows] == texts and [r.label for r in rows] == [0, 1, 0, 1]
    assert all(r.problem is None for r in rows)
    path.write_bytes(("\n".join(lines[:2]) + "\n[1\n" + lines[3]).encode("utf-8"))
    problems = [r.problem for r in read_rows(path) if r.problem]
    assert len(problems) == 1 and problems[0].startswith(f"{path}:3: not a JSON object")
