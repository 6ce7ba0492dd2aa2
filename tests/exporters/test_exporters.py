"""Tests for rulegraph.exporters on tiny random-weight models (no network)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

pytest.importorskip("transformers")
from tiny import BUILDERS, VOCAB, build, tokenizer  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from rulegraph.exporters import (  # noqa: E402
    EXPORTERS,
    HFClassifier,
    export_fx,
    export_hf,
    export_hf_fx,
    export_onnx,
    load_hf,
    read_metadata,
)

EXPECTED = {
    "bert": dict(labels=("negative", "positive"), inputs=("input_ids", "attention_mask", "token_type_ids"), max_length=64),
    "gpt2": dict(labels=("LABEL_0", "LABEL_1", "LABEL_2"), inputs=("input_ids", "attention_mask"), max_length=64),
    "distilbert": dict(labels=("LABEL_0", "LABEL_1"), inputs=("input_ids", "attention_mask"), max_length=64),
    "roberta": dict(labels=("LABEL_0", "LABEL_1"), inputs=("input_ids", "attention_mask"), max_length=64),
}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One saved tiny model (weights, config, tokenizer.json) per model type."""
    root = tmp_path_factory.mktemp("hf")
    dirs = {}
    for name in BUILDERS:
        path = root / name
        build(name).save_pretrained(path)
        tokenizer().save(str(path / "tokenizer.json"))
        dirs[name] = path
    return dirs


def _inputs(names: tuple[str, ...], pad_id: int, batch: int = 3, length: int = 13) -> dict[str, np.ndarray]:
    """Random token ids with right padding, in a shape unlike the exporters' example (2 x 8)."""
    rng = np.random.default_rng(1)
    ids = rng.integers(5, len(VOCAB), size=(batch, length), dtype=np.int64)
    mask = np.ones((batch, length), dtype=np.int64)
    mask[1, length - 4 :] = 0
    mask[2, 5:] = 0
    ids[mask == 0] = pad_id
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    return {name: feeds[name] for name in names}


def _torch_logits(module: torch.nn.Module, feeds: dict[str, np.ndarray]) -> np.ndarray:
    with torch.no_grad():
        return module(**{k: torch.from_numpy(v) for k, v in feeds.items()}).numpy()


def _assert_close(actual: np.ndarray, expected: np.ndarray) -> None:
    """Equal within 1e-4 relative to the largest expected magnitude."""
    assert actual.shape == expected.shape
    assert np.abs(actual - expected).max() <= 1e-4 * np.abs(expected).max()


def _check_onnx_against_torch(model_path: Path, name: str, hf_dir: Path) -> None:
    module, info = load_hf(hf_dir)
    feeds = _inputs(info.input_names, info.pad_token_id)
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == list(EXPECTED[name]["inputs"])
    assert [o.name for o in session.get_outputs()] == ["logits"]
    assert all(i.shape == ["batch", "sequence"] for i in session.get_inputs())
    (logits,) = session.run(None, feeds)
    _assert_close(logits, _torch_logits(module, feeds))


@pytest.mark.parametrize("name", list(BUILDERS))
def test_load_hf_reads_labels_inputs_and_max_length(hf_dirs: dict[str, Path], name: str) -> None:
    module, info = load_hf(hf_dirs[name])
    assert isinstance(module, HFClassifier) and not module.training
    assert info.model_type == name
    assert info.labels == EXPECTED[name]["labels"]
    assert info.input_names == EXPECTED[name]["inputs"]
    assert info.max_length == EXPECTED[name]["max_length"]
    assert module.model.config._attn_implementation == "eager"


@pytest.mark.parametrize("name", list(BUILDERS))
def test_export_hf_torchscript_runs_in_onnxruntime(hf_dirs: dict[str, Path], tmp_path: Path, name: str) -> None:
    path = export_hf(hf_dirs[name], tmp_path / "out")
    assert path == tmp_path / "out" / "model.onnx"
    _check_onnx_against_torch(path, name, hf_dirs[name])
    meta = read_metadata(path)
    assert json.loads(meta["rulegraph.labels"]) == list(EXPECTED[name]["labels"])
    assert meta["rulegraph.max_length"] == str(EXPECTED[name]["max_length"])
    assert meta["rulegraph.exporter"] == "torchscript"
    assert meta["rulegraph.model_type"] == name
    assert meta["rulegraph.source"] == str(hf_dirs[name].resolve())
    copied = tmp_path / "out" / "tokenizer.json"
    assert copied.read_bytes() == (hf_dirs[name] / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_export_hf_dynamo_runs_in_onnxruntime(hf_dirs: dict[str, Path], tmp_path: Path, name: str) -> None:
    path = export_hf(hf_dirs[name], tmp_path, exporter="dynamo", metadata={"rulegraph.source": "tiny"})
    _check_onnx_against_torch(path, name, hf_dirs[name])
    meta = read_metadata(path)
    assert meta["rulegraph.exporter"] == "dynamo"
    assert meta["rulegraph.source"] == "tiny"


def test_eager_attention_gives_explicit_softmax(hf_dirs: dict[str, Path], tmp_path: Path) -> None:
    path = export_hf(hf_dirs["bert"], tmp_path)
    ops = {node.op_type for node in onnx.load(path).graph.node}
    assert {"Softmax", "MatMul", "LayerNormalization"} <= ops


def test_exported_tokenizer_feeds_the_model(hf_dirs: dict[str, Path], tmp_path: Path) -> None:
    path = export_hf(hf_dirs["bert"], tmp_path)
    encoding = Tokenizer.from_file(str(tmp_path / "tokenizer.json")).encode("w1 w2 w3 w4")
    feeds = {
        "input_ids": np.array([encoding.ids], dtype=np.int64),
        "attention_mask": np.array([encoding.attention_mask], dtype=np.int64),
        "token_type_ids": np.array([encoding.type_ids], dtype=np.int64),
    }
    (logits,) = ort.InferenceSession(str(path)).run(None, feeds)
    module, _ = load_hf(hf_dirs["bert"])
    _assert_close(logits, _torch_logits(module, feeds))


@pytest.mark.parametrize("name", list(BUILDERS))
def test_export_hf_fx_matches_module(hf_dirs: dict[str, Path], name: str) -> None:
    program, info = export_hf_fx(hf_dirs[name])
    assert isinstance(program, torch.export.ExportedProgram)
    module, _ = load_hf(hf_dirs[name])
    feeds = _inputs(info.input_names, info.pad_token_id)
    with torch.no_grad():
        logits = program.module()(**{k: torch.from_numpy(v) for k, v in feeds.items()}).numpy()
    _assert_close(logits, _torch_logits(module, feeds))


class _Scaled(torch.nn.Module):
    """Token embedding scaled by a float vector: one 2-D integer input and one float input."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)

    def forward(self, tokens: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.embed(tokens) * scale
        return hidden.sum(dim=1), hidden.amax(dim=(1, 2))


def _scaled_inputs(batch: int, length: int) -> dict[str, torch.Tensor]:
    return {"tokens": torch.arange(batch * length).reshape(batch, length) % 10, "scale": torch.linspace(0.5, 2.0, 4)}


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_export_onnx_generic_module(tmp_path: Path, exporter: str) -> None:
    module = _Scaled()
    path = export_onnx(
        module, _scaled_inputs(2, 5), tmp_path / "sub" / "m.onnx", exporter=exporter,
        output_names=["pooled", "peak"], metadata={"k": "v"},
    )
    model = onnx.load(path)
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    assert dims == {"tokens": ["batch", "sequence"], "scale": [4]}
    meta = read_metadata(path)
    assert meta.pop("rulegraph.export_check").startswith(f"{exporter}: onnxruntime at batch 1 × sequence 2 and batch "
                                                         "3 × sequence 10 agrees with the module")
    assert meta == {"k": "v", "rulegraph.exporter": exporter}
    other = _scaled_inputs(3, 7)
    pooled, peak = ort.InferenceSession(str(path)).run(["pooled", "peak"], {k: v.numpy() for k, v in other.items()})
    expected = module(**other)
    _assert_close(pooled, expected[0].detach().numpy())
    _assert_close(peak, expected[1].detach().numpy())


def test_export_onnx_static_axes(tmp_path: Path) -> None:
    path = export_onnx(_Scaled(), _scaled_inputs(2, 5), tmp_path / "m.onnx", dynamic_axes=False)
    tokens = onnx.load(path).graph.input[0]
    assert [d.dim_value for d in tokens.type.tensor_type.shape.dim] == [2, 5]


def test_export_fx_generic_module() -> None:
    module = _Scaled()
    program = export_fx(module, _scaled_inputs(2, 5))
    other = _scaled_inputs(4, 3)
    for got, expected in zip(program.module()(**other), module(**other)):
        _assert_close(got.detach().numpy(), expected.detach().numpy())


def test_export_onnx_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(b"keep me")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export_onnx(_Scaled(), _scaled_inputs(2, 5), path)
    assert path.read_bytes() == b"keep me"
    export_onnx(_Scaled(), _scaled_inputs(2, 5), path, overwrite=True)
    onnx.checker.check_model(onnx.load(path))


def test_export_hf_refuses_to_overwrite(hf_dirs: dict[str, Path], tmp_path: Path) -> None:
    export_hf(hf_dirs["distilbert"], tmp_path)
    with pytest.raises(FileExistsError, match="model.onnx already exists"):
        export_hf(hf_dirs["distilbert"], tmp_path)
    export_hf(hf_dirs["distilbert"], tmp_path, overwrite=True)


def test_missing_model_directory(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="model directory not found"):
        load_hf(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="model directory not found"):
        export_hf(tmp_path / "nope", tmp_path / "out")


def test_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no config.json in"):
        export_hf(tmp_path, tmp_path / "out")


def test_directory_without_tokenizer(hf_dirs: dict[str, Path], tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    for file in hf_dirs["bert"].iterdir():
        if file.name != "tokenizer.json":
            (bare / file.name).write_bytes(file.read_bytes())
    with pytest.raises(FileNotFoundError, match=f"no tokenizer.json in {bare}"):
        export_hf(bare, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_bad_options(hf_dirs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="opset 16 is not supported by the torchscript exporter; valid: 17…20"):
        export_hf(hf_dirs["bert"], tmp_path, opset=16)
    with pytest.raises(ValueError, match="unknown exporter 'onnx'; valid: torchscript, dynamo"):
        export_hf(hf_dirs["bert"], tmp_path, exporter="onnx")
    with pytest.raises(ValueError, match="unknown exporter"):
        export_onnx(_Scaled(), _scaled_inputs(2, 5), tmp_path / "m.onnx", exporter="tflite")
    with pytest.raises(ValueError, match="unknown attention 'flash'; valid: eager, sdpa"):
        load_hf(hf_dirs["bert"], attention="flash")
    with pytest.raises(ValueError, match="metadata must map strings to strings"):
        export_onnx(_Scaled(), _scaled_inputs(2, 5), tmp_path / "m.onnx", metadata={"n": 3})
    with pytest.raises(ValueError, match="non-empty dict"):
        export_onnx(_Scaled(), {}, tmp_path / "m.onnx")
    with pytest.raises(ValueError, match="size 1 on axis 0"):
        export_fx(_Scaled(), _scaled_inputs(1, 5))
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_export_leaves_every_module_in_its_mode(tmp_path: Path, exporter: str) -> None:
    """Exporting a wrapper must not switch on the dropout of the model it wraps."""
    model = build("bert")
    wrapper = HFClassifier(model)
    assert not wrapper.training
    export_onnx(wrapper, {k: torch.from_numpy(v) for k, v in _inputs(("input_ids", "attention_mask"), 0, 3, 8).items()},
                tmp_path / "m.onnx", exporter=exporter)
    assert not any(m.training for m in model.modules())
