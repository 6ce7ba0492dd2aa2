"""`rulegraph export` on a Hugging Face image classifier (a tiny random-weight ViT saved with
``save_pretrained``, with its image processor): the export takes ``pixel_values`` with a dynamic batch,
equals the module in onnxruntime under both ONNX exporters, carries the labels, image size and
normalisation in its metadata, and every shipped transformer rule set covers it and conserves; the same
for ``--format fx`` (a torch.export program)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

pytest.importorskip("transformers")

import rulegraph  # noqa: E402
from rulegraph.cli import main  # noqa: E402
from rulegraph.exporters import HFImageClassifier, export_hf, load_hf, read_metadata  # noqa: E402

SIZE = 16
MEAN, STD = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]


@pytest.fixture(scope="module")
def vit_dir(tmp_path_factory) -> Path:
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor
    torch.manual_seed(0)
    config = ViTConfig(image_size=SIZE, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=64, num_labels=3,
                       id2label={0: "cat", 1: "dog", 2: "fox"}, label2id={"cat": 0, "dog": 1, "fox": 2})
    path = tmp_path_factory.mktemp("vit") / "vit"
    ViTForImageClassification(config).save_pretrained(path)
    ViTImageProcessor(size={"height": SIZE, "width": SIZE}, image_mean=MEAN, image_std=STD).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def exported(vit_dir, tmp_path_factory) -> dict[str, Path]:
    out = {}
    for exporter in ("torchscript", "dynamo"):
        folder = tmp_path_factory.mktemp(exporter)
        assert main(["export", str(vit_dir), str(folder), "--exporter", exporter]) == 0
        out[exporter] = folder / "model.onnx"
    return out


def pixels(batch: int = 3) -> torch.Tensor:
    return torch.randn(batch, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(5))


def test_load_hf_reads_an_image_classifier(vit_dir):
    module, info = load_hf(vit_dir)
    assert isinstance(module, HFImageClassifier) and not module.training
    assert info.task == "image-classification" and info.model_type == "vit"
    assert info.input_names == ("pixel_values",) and info.labels == ("cat", "dog", "fox")
    assert info.image_size == (3, SIZE, SIZE) and info.max_length is None
    assert info.image_mean == pytest.approx(MEAN) and info.image_std == pytest.approx(STD)
    assert set(info.example_inputs()) == {"pixel_values"}


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_export_equals_the_module_in_onnxruntime(vit_dir, exported, exporter):
    path = exported[exporter]
    assert (path.parent / "preprocessor_config.json").is_file() and not (path.parent / "tokenizer.json").exists()
    meta = read_metadata(path)
    assert json.loads(meta["rulegraph.labels"]) == ["cat", "dog", "fox"]
    assert meta["rulegraph.task"] == "image-classification"
    assert json.loads(meta["rulegraph.image_size"]) == [3, SIZE, SIZE]
    assert json.loads(meta["rulegraph.image_mean"]) == pytest.approx(MEAN)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["pixel_values"]
    x = pixels(3)                                       # not the example's batch of 2: the batch is dynamic
    (logits,) = session.run(None, {"pixel_values": x.numpy()})
    module, _ = load_hf(vit_dir)
    with torch.no_grad():
        expected = module(x).numpy()
    assert np.abs(logits - expected).max() <= 1e-4 * np.abs(expected).max()
    ours = rulegraph.run(rulegraph.load(str(path)), {"pixel_values": x})["logits"]
    assert np.abs(ours.numpy() - expected).max() <= 1e-4 * np.abs(expected).max()


@pytest.mark.parametrize("rules", sorted(rulegraph.shipped_rule_sets()))
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_every_transformer_rule_set_covers_and_conserves(exported, exporter, rules, capsys):
    path = exported[exporter]
    assert main(["check", str(path), "-r", rules]) == 0, capsys.readouterr().out
    e = rulegraph.explain(str(path), rules, {"pixel_values": pixels(2).double()}, dtype=torch.float64)
    assert e.audit.conservation.relative_error < 1e-10
    assert not e.audit.unexpected
    assert all(torch.isfinite(r).all() for r in e.relevance.values())


@pytest.fixture(scope="module")
def fx_export(vit_dir, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fx")
    assert main(["export", str(vit_dir), str(folder), "--format", "fx"]) == 0
    assert (folder / "preprocessor_config.json").is_file()
    return folder / "model.pt2"


def test_fx_export_equals_the_module(vit_dir, fx_export):
    module, _ = load_hf(vit_dir)
    x = pixels(3)
    with torch.no_grad():
        expected = module(x)
    got = rulegraph.run(rulegraph.load(str(fx_export)), {"pixel_values": x})["logits"]
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rules", sorted(rulegraph.shipped_rule_sets()))
def test_fx_export_covers_and_conserves(fx_export, rules, capsys):
    assert main(["check", str(fx_export), "-r", rules]) == 0, capsys.readouterr().out
    e = rulegraph.explain(str(fx_export), rules, {"pixel_values": pixels(2).double()}, dtype=torch.float64)
    assert e.audit.conservation.relative_error < 1e-10
    assert not e.audit.unexpected


def test_export_refuses_a_model_with_no_classification_head(tmp_path, capsys):
    from transformers import ViTMAEConfig, ViTMAEModel         # a masked autoencoder: no classifier in transformers
    ViTMAEModel(ViTMAEConfig(image_size=SIZE, patch_size=4, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                             intermediate_size=64)).save_pretrained(tmp_path / "bare")
    with pytest.raises(ValueError, match="has no head rulegraph exports"):
        export_hf(tmp_path / "bare", tmp_path / "out")
    assert main(["export", str(tmp_path / "bare"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "has no head rulegraph exports" in err and "Traceback" not in err


@pytest.mark.parametrize("fmt", ["onnx", "fx"])
def test_explain_image_takes_size_and_normalisation_from_the_export(exported, fx_export, fmt, tmp_path, capsys):
    """`explain --image` on a `rulegraph export` of a ViT: the crop is the model's 16×16 and the
    normalisation its image processor's, with no --size / --mean / --std given."""
    from PIL import Image
    from rulegraph.image import load_image, preprocessing
    model = exported["torchscript"] if fmt == "onnx" else fx_export
    graph = rulegraph.load(str(model))
    assert preprocessing(graph.metadata) == dict(size=(SIZE, SIZE), resize=None, mean=tuple(MEAN), std=tuple(STD),
                                                 channels_last=False)     # resized straight to the model's sides
    given = preprocessing(graph.metadata, size=12, mean=(0, 0, 0))                     # what is given wins
    assert given["size"] == (12, 12) and given["mean"] == (0, 0, 0) and given["std"] == tuple(STD)
    picture = tmp_path / "p.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (20, 30, 3), dtype=np.uint8)).save(picture)
    out = tmp_path / "e.json"
    assert main(["explain", str(model), "-r", "epsilon", "--image", str(picture), "--json", str(out),
                 "--png", str(tmp_path / "h.png"), "--dtype", "float64"]) == 0, capsys.readouterr()
    x = load_image(picture, size=SIZE, resize=SIZE, mean=MEAN, std=STD).double()
    e = rulegraph.explain(graph, "epsilon", {"pixel_values": x}, dtype=torch.float64)
    assert json.loads(out.read_text())["output_value"] == pytest.approx(e.output_value[0], rel=1e-9)


def test_export_of_an_efficientnet_directory_covers_and_conserves_under_the_cnn_rule_sets(tmp_path, capsys):
    """The same command on a convolutional image classifier (EfficientNet: SiLU as x·σ(x),
    squeeze-and-excitation), explained by every rule set that claims CNNs."""
    import sys
    sys.path.insert(0, str(Path(__file__).parents[1] / "rules"))
    from test_cnn_families import efficientnet
    efficientnet().model.float().save_pretrained(tmp_path / "effnet")
    assert main(["export", str(tmp_path / "effnet"), str(tmp_path / "out")]) == 0
    path = tmp_path / "out" / "model.onnx"
    assert read_metadata(path)["rulegraph.task"] == "image-classification"
    for rules in sorted(rulegraph.shipped_rule_sets("cnns")):
        assert main(["check", str(path), "-r", rules]) == 0, capsys.readouterr().out
        e = rulegraph.explain(str(path), rules, {"pixel_values": pixels(3).double()}, dtype=torch.float64)
        c = e.audit.conservation
        assert abs(c.output_value) > 1e-2 and abs(c.residual) <= 1e-10 * abs(c.output_value)
        assert not e.audit.unexpected and c.breaks == 0.0
