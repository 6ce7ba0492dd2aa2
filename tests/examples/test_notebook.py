"""examples/notebook/rulegraph.ipynb runs top to bottom in a real kernel (nbclient + ipykernel, this
interpreter), every cell without error, and what it shows holds up: each result type's HTML view
(``_repr_html_`` of an explanation, a batch, a baseline, a generation, an encoder–decoder's
generation, an image explanation, a clip's, a generation over a clip) loaded in headless Chromium has a coloured
span per token, a matrix cell per row and generated token (a T5 in memory and Whisper's clip rows too), a picture
(an image given as ``image=``) that decodes, and leaves the notebook's own page alone;
the figures are there. The notebook's results are read back from the kernel after its last cell."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from browser import CHROMIUM, bare_page, open_page, screenshot_is_not_blank
from rulegraph.image import IMAGENET_MEAN, IMAGENET_STD

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "notebook" / "rulegraph.ipynb"
#: the cells' tags whose HTML output is checked; each names the variable it shows
VIEWS = {"classifier": "e", "batch": "batch", "baseline": "ig", "generation": "g", "encoder-decoder": "s",
         "t5": "t", "image": "v", "audio": "a", "speech": "heard"}
#: run after the notebook's cells: what the views should show, from the objects themselves
FACTS = """
import json as _json
_facts = {tag: {"texts": x.texts, "scores": [x.scores(None, i) for i in range(x.batch_size)],
                "audited": x.audit is not None}
          for tag, x in {"classifier": e, "batch": batch, "baseline": ig}.items()}
_facts.update({tag: {"rows": x.rows, "columns": x.columns, "matrix": x.to_dict()["matrix"], "groups": x.groups}
               for tag, x in {"generation": g, "encoder-decoder": s, "t5": t, "speech": heard}.items()})
_facts["image"] = {"labels": v.labels, "target": v.target, "pixels": list(v.pixels["pixel_values"].shape),
                   "normalization": v.normalization}
_facts["audio"] = {"audio": a.extra["audio"], "clip": list(a.clip["input_values"].shape), "ok": a.audit.ok}
print(_json.dumps(_facts))
"""


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """The notebook executed in a kernel of this interpreter, and the facts cell's output."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    folder = tmp_path_factory.mktemp("kernel")
    spec = folder / "kernels" / "python3"          # this interpreter, whatever other kernels are installed
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "rulegraph tests", "language": "python"}))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in notebook.cells
               if c.cell_type == "code"), "the notebook is committed without outputs"
    notebook.cells.append(nbformat.v4.new_code_cell(FACTS))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JUPYTER_PATH", str(folder))
        patch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
        client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                                         resources={"metadata": {"path": str(NOTEBOOK.parent)}})
        client.execute()                         # a cell's error raises CellExecutionError, naming the cell
    facts = json.loads("".join(o.get("text", "") for o in notebook.cells[-1].outputs if o.output_type == "stream"))
    return notebook, facts


def _outputs(notebook, kind: str) -> dict[str, list]:
    """Per tagged cell, its outputs of MIME type ``kind``."""
    found: dict[str, list] = {}
    for cell in notebook.cells:
        for tag in cell.metadata.get("tags", []):
            found[tag] = [o["data"][kind] for o in cell.get("outputs", []) if kind in o.get("data", {})]
    return found


def test_the_notebook_runs_and_shows_every_result(executed):
    notebook, facts = executed
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code)
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    html = _outputs(notebook, "text/html")
    plain = _outputs(notebook, "text/plain")
    for tag in VIEWS:
        assert len(html[tag]) == 1, f"cell {tag}: no HTML view"
        assert plain[tag] and len(plain[tag][0].splitlines()) <= 6, f"cell {tag}: its repr is not one screen"
    figures = [o for c in code for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(figures) >= 5                     # e.plot(), the rule set beside ig, g.plot(), v.plot(), a.plot()
    assert facts["classifier"]["audited"] and not facts["baseline"]["audited"]
    assert len(facts["batch"]["texts"]) == 3 and facts["image"]["labels"] == ["landscape", "portrait", "still life"]
    assert facts["image"]["pixels"] == [1, 3, 32, 32]            # image=: a 64 × 48 picture at the ViT's own size
    assert facts["image"]["normalization"] == [list(IMAGENET_MEAN), list(IMAGENET_STD)]
    assert facts["audio"] == {"audio": {"input": "input_values", "sampling_rate": 16000, "per_second": 16000.0},
                              "clip": [1, 4000], "ok": True}             # audio=: an array at the assumed 16 kHz
    t5 = facts["t5"]                                             # a T5 in memory, generating greedily
    assert len(t5["columns"]) == 3 and t5["groups"].count("source") == 7          # the source's seven words
    speech = facts["speech"]                                     # Whisper over the quarter-second clip
    assert speech["groups"] == ["audio"] * 11 + ["target"] * 4 and speech["rows"][-5] == "padding 0.25–1.00 s"


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (Debian: apt-get install "
                                             "chromium; .ci/run installs it)")
def test_the_notebooks_html_views_in_chromium(executed, tmp_path):
    notebook, facts = executed
    views = {tag: shown[0] for tag, shown in _outputs(notebook, "text/html").items() if tag in VIEWS}
    report, shot = open_page(bare_page(views), tmp_path, "notebook", size=(1100, 6000))
    seen = screenshot_is_not_blank(shot)
    assert seen["inked"] > 0.02 and seen["colours"] > 20, seen
    assert report["body"]["margin"] == "8px"             # the views leave the notebook's page as it was
    assert report["width"] <= report["viewport"]
    for tag in ("classifier", "batch", "baseline"):
        shown, expected = report["views"][tag], facts[tag]
        assert len(shown["tokens"]) == len(expected["texts"]), tag                 # one paragraph per item
        for spans, texts, scores in zip(shown["tokens"], expected["texts"], expected["scores"]):
            assert [s["text"] for s in spans] == [t.lstrip(" ") for t in texts], tag
            assert [float(s["score"]) for s in spans] == pytest.approx(scores[:len(texts)], rel=1e-5, abs=1e-9)
            assert all(s["width"] > 0 and s["ink"] in ("rgb(0, 0, 0)", "rgb(255, 255, 255)") for s in spans)
        assert shown["transparent"] == 0 and (shown["tables"] > 0) == expected["audited"], tag
    for tag in ("generation", "encoder-decoder", "t5", "speech"):
        (matrix,) = report["views"][tag]["matrices"]
        expected = facts[tag]
        assert matrix["header"] == len(expected["columns"]) and [r["token"] for r in matrix["rows"]] == expected["rows"]
        for row, values in zip(matrix["rows"], expected["matrix"]):
            assert [c is None for c in row["cells"]] == [v is None for v in values], tag
            assert [float(c["value"]) for c in row["cells"] if c] == pytest.approx([v for v in values if v is not None],
                                                                                 rel=1e-5, abs=1e-12)
    (image,) = report["views"]["image"]["images"]
    assert image["complete"] and image["width"] > 200 and image["height"] > 50 and image["shown"] > 0
