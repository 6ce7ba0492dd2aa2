"""Images as deployed: NHWC inputs, a non-square fixed size, a free width (a text-line recognizer),
an image given as an ``--input`` array; each explained from a PNG written here."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image
from torch import nn

import cnn
from rulegraph.cli import cli, main
from rulegraph.errors import InputError
from rulegraph.image import Layout, layout_of, load, parse_size, pixel_map, preprocessing


class ChannelsLast(nn.Module):
    """The tiny CNN behind a ``permute``: it takes ``[N, H, W, C]`` as TensorFlow-born exports do."""

    def __init__(self):
        super().__init__()
        self.body = cnn.build("cnn")

    def forward(self, x):
        return self.body(x.permute(0, 3, 1, 2))


def export(module: nn.Module, path, example: torch.Tensor, free: dict[int, str] | None = None):
    torch.onnx.export(module.float(), (example.float(),), str(path), input_names=["pixel_values"],
                      output_names=["logits"], opset_version=17, dynamo=False,
                      dynamic_axes={"pixel_values": {0: "batch", **(free or {})}, "logits": {0: "batch"}})
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("layouts")
    return {
        "nhwc": export(ChannelsLast(), d / "nhwc.onnx", torch.zeros(1, 16, 16, 3)),
        "wide": export(cnn.build("cnn"), d / "wide.onnx", torch.zeros(1, 3, 80, 160)),
        "line": export(cnn.build("cnn"), d / "line.onnx", torch.zeros(1, 3, 48, 96), {3: "width"}),
    }


@pytest.fixture()
def picture(tmp_path):
    """A 120×80 (W×H) RGB gradient."""
    rows, cols = np.mgrid[0:80, 0:120]
    path = tmp_path / "x.png"
    Image.fromarray(np.stack([cols * 2, rows * 3, np.full_like(rows, 90)], -1).astype(np.uint8)).save(path)
    return path


def explain(model, *args):
    return CliRunner().invoke(cli, ["explain", str(model), "--rules", "epsilon-gamma-box", *args])


def aspect(path) -> float:
    w, h = Image.open(path).size
    return w / h


CROPPED = "W×H 120×80 resized to {}, then center-cropped to {} ({} columns and {} rows cut"


@pytest.mark.parametrize("name, tensor, note, ratio", [
    ("nhwc", "NHWC 1×16×16×3", CROPPED.format("24×16", "16×16", 8, 0), 1.0),
    ("wide", "NCHW 1×3×80×160", CROPPED.format("160×107", "160×80", 0, 27), 2.0),
    ("line", "NCHW 1×3×48×72", "W×H 120×80 resized to 72×48 (to the height the model fixes; the aspect ratio "
                               "kept, no crop)", 1.5),
])
def test_explained_in_the_model_s_own_layout_and_size(tmp_path, models, picture, name, tensor, note, ratio):
    out = tmp_path / "h.png"
    result = explain(models[name], "--image", str(picture), "--png", str(out))
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert f"pixel_values {tensor}:" in said and note in said
    assert 1.8 * ratio < aspect(out) < 3.6 * ratio        # input, overlay, heatmap: each of the image's aspect


def test_a_free_width_follows_the_image(tmp_path, models):
    tall = tmp_path / "tall.png"
    Image.fromarray(np.full((96, 60, 3), 128, np.uint8)).save(tall)
    pre = preprocessing({}, layout=layout_of("x", (1, 3, 48, "width")))
    x, note = load(tall, **pre)
    assert x.shape == (1, 3, 48, 30) and "cropped" not in note
    result = CliRunner().invoke(cli, ["explain", str(models["line"]), "--method", "gi", "--image", str(tall)])
    assert result.exit_code == 0, result.output
    assert "pixel_values NCHW 1×3×48×30:" in " ".join(result.output.split())


def test_nhwc_tensor_is_the_nchw_one_permuted(picture):
    pre = preprocessing({}, size=(20, 40))
    nchw, _ = load(picture, **pre)
    nhwc, _ = load(picture, **{**pre, "channels_last": True})
    assert nhwc.shape == (1, 20, 40, 3)
    assert torch.equal(nhwc, nchw.permute(0, 2, 3, 1))
    r = torch.randn(1, 20, 40, 3, dtype=torch.float64)
    np.testing.assert_allclose(pixel_map(r), pixel_map(r.permute(0, 3, 1, 2)))


def test_same_aspect_is_resized_only_and_said(picture):
    x, note = load(picture, **preprocessing({}, size="40,60"))
    assert x.shape == (1, 3, 40, 60) and note == "W×H 120×80 resized to 60×40"


@pytest.mark.parametrize("shape, layout", [
    ((1, 3, 80, 160), Layout(False, 3, 80, 160)),
    (("b", 48, "w", 3), Layout(True, 3, 48, None)),
    ((1, 1, 28, 28), Layout(False, 1, 28, 28)),
    ((1, 28, 28, 1), Layout(True, 1, 28, 28)),
])
def test_layout_of_the_declared_shape(shape, layout):
    assert layout_of("x", shape) == layout


def test_metadata_size_may_be_rectangular():
    pre = preprocessing({"rulegraph.image_size": "[3, 32, 64]"})
    assert pre["size"] == (32, 64) and pre["resize"] is None


def test_grey_model_gets_one_channel(tmp_path, picture):
    pre = preprocessing({}, layout=Layout(True, 1, 24, 24))
    x, _ = load(picture, **pre)
    assert x.shape == (1, 24, 24, 1) and len(pre["mean"]) == 1


@pytest.mark.parametrize("size", ["a", "3,4,5", "0", "-2,4", "4,"])
def test_bad_size_is_one_line_naming_the_forms(size):
    with pytest.raises(InputError, match=r"give N \(a square\) or H,W"):
        parse_size(size)


def refusal(capsys, *argv) -> str:
    """``rulegraph explain …`` refused: exit 2, one line on stderr, returned."""
    assert main(["explain", *map(str, argv), "--rules", "epsilon-gamma-box"]) == 2
    said = capsys.readouterr().err.strip()
    assert len(said.splitlines()) == 1, said
    return said


def test_bad_size_on_the_command_line(capsys, models, picture):
    said = refusal(capsys, models["wide"], "--image", picture, "--size", "80x")
    assert "--size '80x': give N (a square) or H,W" in said


def test_a_size_the_model_does_not_take_is_refused(capsys, models, picture):
    said = refusal(capsys, models["wide"], "--image", picture, "--size", "80")
    assert "the model's input takes 80 × 160 (H × W)" in said
    said = refusal(capsys, models["line"], "--image", picture, "--size", "32,64")
    assert "takes 48 × any (H × W)" in said


def test_the_html_page_of_an_nhwc_image_shows_it(tmp_path, models, picture):
    import base64
    import io
    page = tmp_path / "e.html"
    result = explain(models["nhwc"], "--image", str(picture), "--html", str(page))
    assert result.exit_code == 0, result.output
    encoded = page.read_text().split("data:image/png;base64,")[1].split('"')[0]
    assert 1.8 < aspect(io.BytesIO(base64.b64decode(encoded))) < 3.6
    assert not (tmp_path / "e.png").exists()          # only the outputs asked for


def test_five_channels_last_is_refused_naming_the_layouts(capsys, tmp_path, picture):
    class Five(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(5, 2, 3)

        def forward(self, x):
            return self.conv(x.permute(0, 3, 1, 2)).mean((2, 3))

    model = export(Five(), tmp_path / "five.onnx", torch.zeros(1, 8, 8, 5))
    said = refusal(capsys, model, "--image", picture)
    assert "no 1 or 3 channels on axis 1 (NCHW) or axis 3 (NHWC)" in said


def test_an_image_array_input_is_summarised_and_drawn(tmp_path, models):
    arr = tmp_path / "arr.npy"
    np.save(arr, cnn.image(1, 16).float().numpy().transpose(0, 2, 3, 1).copy())        # NHWC
    out = tmp_path / "h.png"
    result = explain(models["nhwc"], "-i", f"pixel_values={arr}", "--png", str(out))
    assert result.exit_code == 0, result.output
    assert len(result.output) < 3000                                 # a summary, not 768 scores
    assert "image relevance 1×16×16×3" in " ".join(result.output.split())
    assert 1.8 < aspect(out) < 3.6


def test_a_long_non_image_input_prints_at_most_a_screen(tmp_path):
    torch.manual_seed(0)
    model = cnn.onnx(nn.Sequential(nn.Linear(5000, 4), nn.ReLU(), nn.Linear(4, 3)), tmp_path / "wide.onnx",
                     torch.zeros(1, 5000))
    arr = tmp_path / "v.npy"
    np.save(arr, np.linspace(-1, 1, 5000, dtype=np.float32)[None])
    result = explain(model, "-i", f"pixel_values={arr}")
    assert result.exit_code == 0, result.output
    assert "4600 more of 5000 scores not shown" in " ".join(result.output.split())
    assert len(result.output) < 12000


def test_a_batch_of_three_texts_is_not_taken_for_an_image():
    """A token boundary ``[batch, positions, hidden]`` with a batch of 3 is no CHW image: the page shows
    each item's tokens, not a heatmap."""
    import tiny
    import rulegraph
    from rulegraph.image import is_image
    boundary = torch.zeros(3, 6, 32)
    assert not is_image(boundary) and not is_image(torch.zeros(1, 6, 3)) and is_image(torch.zeros(1, 3, 8, 8))
    model = tiny.onnx(tiny.build("bert"), Path(tempfile.mkdtemp()) / "bert.onnx")
    page = rulegraph.explain(model, "lrp-ah-ln", tiny.token_inputs(batch=3, length=6))._repr_html_()
    assert page.count('class="tokens"') == 3 and 'class="heatmap"' not in page
