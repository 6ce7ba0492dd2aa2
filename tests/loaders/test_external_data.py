"""ONNX external data: an export forced over the threshold (both exporters) writes model.onnx +
model.onnx.data, round-trips and explains identically to the single-file export, its weights are
memory-mapped; a data location outside the model's folder, a missing data file and offsets or
lengths that do not fit are each one clear error."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import rulegraph
import tiny
from rulegraph.cli import main
from rulegraph.errors import ModelError
from rulegraph.exporters import HFClassifier, export_onnx

META = {"rulegraph.labels": '["negative", "positive"]', "rulegraph.max_length": "64"}


def _export(module, path: Path, exporter: str, **kwargs) -> Path:
    example = tiny.token_inputs(batch=2, length=8, pad=2)
    return export_onnx(HFClassifier(module), example, path, exporter=exporter, overwrite=True, metadata=META, **kwargs)


@pytest.fixture(scope="module", params=["torchscript", "dynamo"])
def pair(request, tmp_path_factory):
    """(single-file export, external-data export) of the tiny BERT by one exporter: built afresh in float32 (other
    tests turn the shared ``bert`` fixture into float64 in place, and onnxruntime has no float64 Erf)."""
    folder = tmp_path_factory.mktemp(f"external_{request.param}")
    bert = tiny.build("bert")
    single = _export(bert, folder / "single" / "model.onnx", request.param)
    external = _export(bert, folder / "external" / "model.onnx", request.param, external_data=0)
    return single, external


def test_the_threshold_decides_the_layout(pair):
    single, external = pair
    assert not (single.parent / "model.onnx.data").exists()
    assert sorted(p.name for p in external.parent.iterdir()) == ["model.onnx", "model.onnx.data"]
    proto = onnx.load(str(external), load_external_data=False)
    big = [t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert big and {e.value for t in big for e in t.external_data if e.key == "location"} == {"model.onnx.data"}
    assert all(int(dict((e.key, e.value) for e in t.external_data)["offset"]) % 64 == 0 for t in big)
    assert proto.metadata_props and {p.key for p in proto.metadata_props} >= set(META)


def test_round_trip_and_identical_explanations(pair):
    single, external = pair
    feeds = tiny.token_inputs(batch=2, length=11, pad=3)
    a, b = rulegraph.load(single), rulegraph.load(external)
    assert a.constants.keys() == b.constants.keys()
    assert all(torch.equal(a.constants[k], b.constants[k]) for k in a.constants)
    session = ort.InferenceSession(str(external), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {k: v.numpy() for k, v in feeds.items()})
    assert np.abs(rulegraph.run(b, feeds)["logits"].numpy() - logits).max() < 1e-5
    for rules in ("lrp-ah-ln", "attnlrp"):
        ea = rulegraph.explain(a, rules, feeds, dtype=torch.float64)
        eb = rulegraph.explain(b, rules, feeds, dtype=torch.float64)
        assert torch.equal(torch.as_tensor(ea.scores("input_ids")), torch.as_tensor(eb.scores("input_ids")))


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the process's mappings (Linux)")
def test_weights_are_memory_mapped(pair):
    """The largest weight's bytes lie in a mapping of model.onnx.data, not in memory the loader allocated."""
    _, external = pair
    graph = rulegraph.load(external)
    table = max(graph.constants.values(), key=lambda t: t.numel())
    start = table.data_ptr()
    mapped = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, *rest = line.split()
        low, high = (int(x, 16) for x in span.split("-"))
        if low <= start < high:
            mapped.append(rest[-1] if len(rest) >= 5 else "")
    assert mapped and mapped[0].endswith("model.onnx.data"), mapped


def test_an_inline_export_over_an_external_one_removes_its_data_file(tmp_path, bert):
    path = _export(bert, tmp_path / "model.onnx", "torchscript", external_data=0)
    assert (tmp_path / "model.onnx.data").exists()
    with pytest.raises(FileExistsError):
        export_onnx(HFClassifier(bert), tiny.token_inputs(batch=2, length=8, pad=2), path)
    _export(bert, path, "torchscript")
    assert not (tmp_path / "model.onnx.data").exists()
    assert rulegraph.load(path).constants


def test_a_negative_threshold_is_refused(tmp_path, bert):
    with pytest.raises(ValueError, match="external_data must be a number of bytes"):
        _export(bert, tmp_path / "model.onnx", "torchscript", external_data=-1)


@pytest.fixture()
def tampered(pair, tmp_path):
    """A copy of the external export, and a function rewriting the external-data entries of its
    largest initializer (key → value; None deletes the key)."""
    _, external = pair
    folder = tmp_path / "model"
    shutil.copytree(external.parent, folder)
    path = folder / "model.onnx"

    def edit(**entries) -> Path:
        proto = onnx.load(str(path), load_external_data=False)
        tensor = max((t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL),
                     key=lambda t: np.prod(t.dims))
        info = {e.key: e.value for e in tensor.external_data}
        info.update(entries)
        del tensor.external_data[:]
        for key, value in info.items():
            if value is not None:
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
        onnx.save(proto, str(path))
        return path
    return edit


@pytest.mark.parametrize("entries, message", [
    ({"location": "../../etc/passwd"}, "climbs out with '..'"),
    ({"location": "sub/../../model.onnx.data"}, "climbs out with '..'"),
    ({"location": "/etc/passwd"}, "is an absolute path"),
    ({"location": "C:\\\\weights.bin"}, "is an absolute path"),
    ({"location": "absent.data"}, "external data file 'absent.data' is missing"),
    ({"location": ""}, "names no location"),
    ({"offset": "999999999"}, "runs to byte"),
    ({"length": "12"}, "holds 12 bytes where its shape"),
    ({"offset": "-4"}, "offset '-4' is not a number of bytes"),
    ({"length": "many"}, "length 'many' is not a number of bytes"),
])
def test_bad_locations_and_ranges_are_one_clear_error(tampered, entries, message, capsys):
    path = tampered(**entries)
    with pytest.raises(ModelError, match=message.replace("(", r"\(")) as info:
        rulegraph.load(path)
    assert "\n" not in str(info.value) and "model.onnx" in str(info.value)
    assert main(["check", str(path), "-r", "gi"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


def test_a_symbolic_link_leaving_the_folder_is_refused(tampered, tmp_path):
    outside = tmp_path / "outside.data"
    outside.write_bytes(b"\0" * 4096)
    path = tampered(location="link.data")
    os.symlink(outside, path.parent / "link.data")
    with pytest.raises(ModelError, match="outside the model's folder"):
        rulegraph.load(path)


def test_a_missing_data_file_is_one_error(tampered):
    path = tampered()
    (path.parent / "model.onnx.data").unlink()
    with pytest.raises(ModelError, match="external data file 'model.onnx.data' is missing from"):
        rulegraph.load(path)


def test_a_model_proto_without_its_folder_names_the_problem(pair):
    _, external = pair
    proto = onnx.load(str(external), load_external_data=False)
    with pytest.raises(ModelError, match="load the model from its .onnx file"):
        rulegraph.load(proto)
