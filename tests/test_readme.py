"""Every Python snippet of the README runs as written, on a tiny model laid out as the README's
`rulegraph export` writes it (out/model.onnx + out/tokenizer.json)."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_python_snippets():
    assert SNIPPETS


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[f"snippet{i}" for i in range(len(SNIPPETS))])
def test_snippet_runs(snippet, bert_onnx, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(bert_onnx, out / "model.onnx")
    shutil.copy(Path(bert_onnx).parent / "tokenizer.json", out / "tokenizer.json")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(snippet, str(README), "exec"), scope)
    e = scope["e"]
    assert e.audit is not None and e.audit.ok
    assert len(e.tokens or [0]) >= 1
