"""Image preprocessing, the heatmap PNG, and `rulegraph explain --image` on a tiny CNN export."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

import cnn
from rulegraph.cli import cli
from rulegraph.errors import InputError
from rulegraph.image import IMAGENET_MEAN, IMAGENET_STD, load_image, write_heatmap


@pytest.fixture()
def picture(tmp_path):
    """A 40×30 RGB image whose pixel (row, col) is (col·6, row·8, 100)."""
    rows, cols = np.mgrid[0:30, 0:40]
    arr = np.stack([cols * 6, rows * 8, np.full_like(rows, 100)], -1).astype(np.uint8)
    path = tmp_path / "img.png"
    Image.fromarray(arr).save(path)
    return path, arr


def test_preprocessing_without_resize_is_a_center_crop_then_normalise(picture):
    path, arr = picture
    x = load_image(path, size=20, resize=30)       # shorter side already 30: no resampling
    assert x.shape == (1, 3, 20, 20) and x.dtype == torch.float32
    crop = arr[5:25, 10:30].astype(np.float64) / 255.0                 # (30−20)/2 = 5, (40−20)/2 = 10
    expected = (crop - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)
    np.testing.assert_allclose(x[0].permute(1, 2, 0).numpy(), expected, rtol=1e-5, atol=1e-5)


def test_preprocessing_resizes_the_shorter_side(picture):
    path, _ = picture
    assert load_image(path, size=8, resize=12).shape == (1, 3, 8, 8)
    x = load_image(path, size=8, resize=12, mean=(0, 0, 0), std=(1, 1, 1))
    assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0


@pytest.mark.parametrize("kwargs, message", [
    ({"size": 20, "resize": 10}, "resize (10) must be at least the crop size (20)"),
    ({"mean": (0, 0)}, "mean and std need 3 values"),
    ({"std": (1, 0, 1)}, "std values must be positive"),
])
def test_preprocessing_errors(picture, kwargs, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_image(picture[0], **kwargs)


def test_unreadable_image_is_one_line(tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_text("not an image")
    with pytest.raises(InputError, match="cannot read"):
        load_image(bad)
    with pytest.raises(InputError, match="image not found"):
        load_image(tmp_path / "missing.png")


def test_heatmap_png(tmp_path):
    r = torch.zeros(1, 3, 8, 8)
    r[0, :, 2, 3] = 1.0
    path = write_heatmap(r, tmp_path / "h.png", image=torch.zeros(1, 3, 8, 8))
    assert Image.open(path).size[0] > 0


def test_cli_explain_image_writes_png(tmp_path, picture):
    model = cnn.onnx(cnn.build("cnn"), tmp_path / "cnn.onnx", cnn.image(1, 16))
    out = tmp_path / "heat.png"
    result = CliRunner().invoke(cli, ["explain", str(model), "--rules", "epsilon-gamma-box", "--image",
                                      str(picture[0]), "--size", "16", "--resize", "24", "--png", str(out),
                                      "--dtype", "float64"])
    assert result.exit_code == 0, result.output
    assert "unexpected breaks" in result.output and "expected breaks" in result.output
    assert Image.open(out).size[0] > 0
    pixels = tmp_path / "x.npy"
    np.save(pixels, cnn.image(1, 16).float().numpy())
    result = CliRunner().invoke(cli, ["explain", str(model), "--rules", "epsilon-gamma-box", "--png", str(out),
                                      "--force", "--input", f"pixel_values={pixels}"])
    assert isinstance(result.exception, InputError)
    assert str(result.exception) == "--png writes an image heatmap: give --image PATH"
