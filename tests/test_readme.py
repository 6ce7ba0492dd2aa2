"""Every Python snippet of the README runs as written, on a tiny model laid out as the README's
`rulegraph export` writes it (out/model.onnx + out/tokenizer.json; for the generation snippets a
tiny GPT-2 LM in gpt2-out/)."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
GENERATION = [s for s in SNIPPETS if "rulegraph.generate(" in s]
SNIPPETS = [s for s in SNIPPETS if s not in GENERATION]


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


def test_the_readme_has_a_generation_snippet():
    assert GENERATION


@pytest.mark.parametrize("snippet", GENERATION, ids=[f"generation{i}" for i in range(len(GENERATION))])
def test_generation_snippet_runs(snippet, tmp_path, monkeypatch):
    import tiny
    from rulegraph.exporters import export_hf
    tiny.save_causal_lm("gpt2", tmp_path / "hf")
    export_hf(tmp_path / "hf", tmp_path / "gpt2-out")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(snippet, str(README), "exec"), scope)
    g = scope["g"]
    assert g.steps and g.matrix.shape == (len(g.rows), len(g.steps))
    if "span=True" in snippet:
        assert g.span is not None and len(g.span.scores) == len(g.rows)
    if "targets=" in snippet:
        t = scope["t"]
        assert len(t) == 3 and all(e.audit.ok for e in t)
