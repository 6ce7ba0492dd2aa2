"""Hostile and unlucky input, built in a scratch folder: models that would run code or ask for
unbounded work, data files that parse wrongly, output paths that are links or inputs. Shared by
``tests/cli/test_hostile_inputs.py`` (the command line) and ``tests/test_hostile_api.py`` (the
Python API).

:func:`build` writes the user's files into ``folder`` and returns the names a case's argv uses
(``{bert}``, ``{lm}``…); everything under ``folder`` is the user's: a refused case must leave it
as it was, links included (:func:`digest`). ``MARKER``: the folder a pickled payload would create.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

import bow
import tiny

MARKER = "payload-ran"


def digest(folder: Path) -> dict[str, str]:
    """Every entry under ``folder`` by path: a file's SHA-256, a link's target (never followed), a folder."""
    out = {}
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in sorted(dirs + files):
            path = Path(root) / name
            key = str(path.relative_to(folder))
            if path.is_symlink():
                out[key] = "link → " + os.readlink(path)
            elif path.is_file():
                out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                out[key] = "folder"
    return out


# -- models ----------------------------------------------------------------------------------------

def _save(model: onnx.ModelProto, path: Path, metadata: dict[str, str] | None = None, tokenizer=None) -> Path:
    for key, value in (metadata or {}).items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    if tokenizer is not None:
        tokenizer.save(str(path.parent / "tokenizer.json"))
    return path


def expand_model(path: Path, size: int = 100_000) -> Path:
    """A few hundred bytes: x [1, 3] expanded to [size, size, 3], then summed (the issue's Expand bomb)."""
    shape = numpy_helper.from_array(np.array([size, size, 3], dtype=np.int64), "shape")
    axes = numpy_helper.from_array(np.array([0, 1], dtype=np.int64), "axes")
    nodes = [helper.make_node("Expand", ["x", "shape"], ["e"], name="expand"),
             helper.make_node("ReduceSum", ["e", "axes"], ["y"], keepdims=0, name="sum")]
    graph = helper.make_graph(nodes, "expand", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], [shape, axes])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)


def opset_model(path: Path, opset: int) -> Path:
    n = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([n], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)


def lm_model(path: Path, metadata: dict[str, str] | None = None) -> Path:
    """A bigram language model (ids → embedding → vocabulary logits at each position): causal, with
    no position table and, unless given, no rulegraph.max_length: nothing states its length limit."""
    rng = np.random.default_rng(0)
    vocab, hidden = len(tiny.VOCAB), 8
    nodes = [helper.make_node("Gather", ["E", "input_ids"], ["h"], name="embed"),
             helper.make_node("MatMul", ["h", "W"], ["logits"], name="head")]
    graph = helper.make_graph(
        nodes, "bigram", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", vocab])],
        [numpy_helper.from_array(rng.standard_normal((vocab, hidden)).astype(np.float32), "E"),
         numpy_helper.from_array(rng.standard_normal((hidden, vocab)).astype(np.float32), "W")])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path, metadata,
                 tiny.lm_tokenizer())


def qa_model(path: Path) -> Path:
    """A span-QA head: start and end logits per position (``[batch, positions]``)."""
    rng = np.random.default_rng(1)
    vocab, hidden = len(tiny.VOCAB), 8
    nodes = [helper.make_node("Gather", ["E", "input_ids"], ["h"], name="embed"),
             helper.make_node("MatMul", ["h", "W"], ["se"], name="head"),
             helper.make_node("Split", ["se"], ["s", "e"], axis=-1, num_outputs=2, name="split"),
             helper.make_node("Squeeze", ["s", "last"], ["start_logits"], name="start"),
             helper.make_node("Squeeze", ["e", "last"], ["end_logits"], name="end")]
    graph = helper.make_graph(
        nodes, "qa", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "sequence"]) for n in ("start_logits",
                                                                                           "end_logits")],
        [numpy_helper.from_array(rng.standard_normal((vocab, hidden)).astype(np.float32), "E"),
         numpy_helper.from_array(rng.standard_normal((hidden, 2)).astype(np.float32), "W"),
         numpy_helper.from_array(np.array([-1], dtype=np.int64), "last")])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path, None, tiny.tokenizer())


def with_metadata(source: Path, path: Path, **changes: str) -> Path:
    """A copy of an ONNX model (and its tokenizer) with some rulegraph.* metadata replaced."""
    model = onnx.load(source)
    for entry in model.metadata_props:
        if entry.key in changes:
            entry.value = changes.pop(entry.key)
    _save(model, path, changes)
    shutil.copy(source.parent / "tokenizer.json", path.parent / "tokenizer.json")
    return path


def fixed_batch(source: Path, path: Path) -> Path:
    """A copy of an ONNX model whose inputs take a batch of exactly 1 (a static export)."""
    model = onnx.load(source)
    for value in model.graph.input:
        dim = value.type.tensor_type.shape.dim[0]
        dim.ClearField("dim_param")
        dim.dim_value = 1
    _save(model, path)
    shutil.copy(source.parent / "tokenizer.json", path.parent / "tokenizer.json")
    return path


class _Payload:
    """Unpickling it creates the folder ``marker`` (harmless, and visible)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def _pickled(marker: Path) -> bytes:
    buffer = io.BytesIO()
    torch.save(_Payload(marker), buffer)
    return buffer.getvalue()


def _rewrite(source: Path, path: Path, change, extra: dict[str, bytes] | None = None,
             compression: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zout:
        root = zin.infolist()[0].filename.split("/")[0]
        for member in zin.infolist():
            zout.writestr(member.filename, change(member.filename, zin.read(member)))
        for name, data in (extra or {}).items():
            zout.writestr(f"{root}/{name}", data, compression)
    return path


def pt2_models(folder: Path, marker: Path) -> dict[str, Path]:
    """A plain torch.export program (``ok``) and archives that would run code or expand without bound."""
    class Linear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(3, 2)

        def forward(self, x):
            return self.l(x)

    torch.manual_seed(0)
    ok = folder / "ok.pt2"
    torch.export.save(torch.export.export(Linear(), (torch.ones(1, 3),)), str(ok), extra_files={"rulegraph.json": "{}"})

    def pickled_weight(name: str, data: bytes) -> bytes:
        if name.endswith("weights_config.json"):
            table = json.loads(data)
            table["config"]["l.weight"]["use_pickle"] = True
            return json.dumps(table).encode()
        return _pickled(marker) if name.endswith("data/weights/weight_0") else data

    def opaque(name: str, data: bytes) -> bytes:
        if name.endswith("constants_config.json"):
            return json.dumps({"config": {"c": {"path_name": "opaque_obj_0", "is_param": False,
                                                "use_pickle": False, "tensor_meta": None}}}).encode()
        return data

    return {
        "ok": ok,
        "pickled-weight": _rewrite(ok, folder / "pickled-weight.pt2", pickled_weight),
        "pickled-inputs": _rewrite(ok, folder / "pickled-inputs.pt2",
                                   lambda n, d: _pickled(marker) if n.endswith("sample_inputs/model.pt") else d),
        "opaque": _rewrite(ok, folder / "opaque.pt2", opaque, {"data/constants/opaque_obj_0": _pickled(marker)}),
        "aoti": _rewrite(ok, folder / "aoti.pt2", lambda n, d: d, {"data/aotinductor/model/model.so": b"\x7fELF"}),
        "bomb": _rewrite(ok, folder / "bomb.pt2", lambda n, d: d, {"extra/padding": b"\0" * (64 * 2**20)},
                         zipfile.ZIP_DEFLATED),
    }


# -- the user's folder -------------------------------------------------------------------------------

def build(folder: Path, bert_onnx: Path) -> dict[str, str]:
    """The user's files (models, data, outputs that are links or inputs) under ``folder``; returns
    the substitutions for a case's argv."""
    folder.mkdir(parents=True, exist_ok=True)
    names = {"dir": str(folder)}
    # models
    bert = folder / "bert"
    bert.mkdir()
    shutil.copy(bert_onnx, bert / "model.onnx")
    specials = tiny.tokenizer()
    specials.add_special_tokens(["[PAD]"])
    specials.save(str(bert / "tokenizer.json"))
    names["bert"] = str(bert / "model.onnx")
    names["bow"] = str(bow.build(folder / "bow"))
    names["bowfixed"] = str(fixed_batch(Path(names["bow"]), folder / "bowfixed" / "model.onnx"))
    names["lm"] = str(lm_model(folder / "lm" / "model.onnx"))
    names["qa"] = str(qa_model(folder / "qa" / "model.onnx"))
    names["expand"] = str(expand_model(folder / "expand.onnx"))
    names["opset99"] = str(opset_model(folder / "opset99.onnx", 99))
    for key, changes in {"labels-json": {"rulegraph.labels": "negative, positive"},
                         "labels-twice": {"rulegraph.labels": '["a", "a"]'},
                         "length-zero": {"rulegraph.max_length": "0"},
                         "length-text": {"rulegraph.max_length": "64 tokens"}}.items():
        names[key] = str(with_metadata(Path(names["bow"]), folder / key / "model.onnx", **changes))
    for key, path in pt2_models(folder, folder / MARKER).items():
        names[f"pt2-{key}"] = str(path)
    hf = folder / "hf"                                  # a Hugging Face folder: config.json + weights + tokenizer
    tiny.save_causal_lm("gpt2", hf)
    names["hf"] = str(hf)
    # data
    data = {
        "ok.csv": "text,label\nw1 w2 w3,1\nw4 w5,0\nw6 w7 w8 w9,1\n",
        "unterminated.csv": 'text,label\n"w1 w2,1\nw3 w4,0\n',
        "merged.csv": 'text,label\n"w1 w2,1\nw3 w4",0\nw5,1\n',
        "ragged.csv": "text,label\nw1 w2,1,0\nw3,0\n",
        "short.csv": "text,label\nw1 w2,1\nw3\n",
        "twice.csv": "text,text,label\nw1,w2,1\n",
        "after-quote.csv": 'text,label\n"w1" w2,1\n',
        "bool.jsonl": '{"text": "w1 w2", "label": true}\n',
        "fraction.jsonl": '{"text": "w1 w2", "label": 1.5}\n',
        "float-id.jsonl": '{"text": "w1 w2", "label": 1.0}\n',
        "huge-label.jsonl": '{"text": "w1 w2", "label": 1000000000000000000000000000000}\n',
        "malformed.jsonl": '{"text": "w1 w2 w3", "label": 1}\n[1, 2]\n{"text": "w4 w5", "label": 0}\n',
        "long.csv": "text,label\n" + "w1 " * 400_000 + ",1\nw2 w3,0\n",
        "long.jsonl": json.dumps({"text": "w1 " * 400_000, "label": 1}) + "\n" + '{"text": "w2 w3", "label": 0}\n',
    }
    for name, text in data.items():
        (folder / name).write_text(text)
    np.save(folder / "bool.npy", np.array([[True, False, True]]))
    (folder / "existing.json").write_text('{"keep": true}')
    (folder / "plot.png").write_bytes(b"not a picture, but the user's")
    (folder / "heads.png").write_bytes(b"the user's")
    # outputs that are links to a file outside the output folder, or are inputs
    victims = folder / "victims"
    victims.mkdir()
    for name in ("summary.json", "rows.jsonl", "config.json", "explanations.parquet", "results.jsonl",
                 "table.csv", "page.json", "masks.yaml", "model.onnx"):
        (victims / name).write_text(f"the user's {name}\n")
    for job, files in {"links-dataset": ("summary.json", "rows.jsonl", "config.json", "explanations.parquet"),
                       "links-evaluate": ("results.jsonl", "table.csv")}.items():
        for name in files:
            out = folder / f"{job}-{name}"
            out.mkdir()
            (out / name).symlink_to(victims / name)
            names[f"{job}-{name}"] = str(out)
    (folder / "link.json").symlink_to(victims / "page.json")
    (folder / "link.yaml").symlink_to(victims / "masks.yaml")
    export = folder / "export-link"
    export.mkdir()
    (export / "model.onnx").symlink_to(victims / "model.onnx")
    inside = folder / "data-in-out"                 # --data inside --out under an output's name
    inside.mkdir()
    (inside / "rows.jsonl").write_text('{"text": "w1 w2", "label": 1}\n')
    (inside / "results.jsonl").write_text('{"text": "w1 w2", "label": 1}\n')
    cut = folder / "cut-config"                     # a config.json cut short by a stop
    cut.mkdir()
    (cut / "config.json").write_text('{"model": "sha256:ab')
    return names
