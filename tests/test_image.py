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
from rulegraph.image import IMAGENET_MEAN, IMAGENET_STD, load_image
from rulegraph.render.figure import image_figure, save


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
    assert result.exit_code == 0, result.output                 # pixels given as an input: their heatmap too
    assert Image.open(out).size[0] > 0


def test_the_html_page_of_an_image_shows_the_picture_and_names_the_class(tmp_path, picture):
    import base64
    import io
    model = cnn.onnx(cnn.build("cnn"), tmp_path / "cnn.onnx", cnn.image(1, 16))
    page = tmp_path / "e.html"
    result = CliRunner().invoke(cli, ["explain", str(model), "--rules", "epsilon-gamma-box", "--image",
                                      str(picture[0]), "--size", "16", "--resize", "24", "--html", str(page)])
    assert result.exit_code == 0, result.output
    text = page.read_text()
    assert 'class="tokens"' not in text                               # no boxes per pixel
    encoded = text.split("data:image/png;base64,")[1].split('"')[0]
    shown = Image.open(io.BytesIO(base64.b64decode(encoded)))
    assert shown.size[0] > 2 * shown.size[1]                          # input, overlay and heatmap side by side
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnn.onnx", "e.html", "img.png"]    # no PNG not asked for


def test_an_image_page_beside_its_picture_leaves_the_picture_alone(tmp_path, picture):
    """`--image v.png --html v.html`: the page only (no `v.png` drawn over the input, no refusal)."""
    model = cnn.onnx(cnn.build("cnn"), tmp_path / "cnn.onnx", cnn.image(1, 16))
    before = picture[0].read_bytes()
    result = CliRunner().invoke(cli, ["explain", str(model), "--rules", "epsilon-gamma-box", "--image",
                                      str(picture[0]), "--size", "16", "--resize", "24", "--html",
                                      str(picture[0].with_suffix(".html"))])
    assert result.exit_code == 0, result.output
    assert picture[0].read_bytes() == before and picture[0].with_suffix(".html").is_file()


# -- values, not only shapes ------------------------------------------------------------------

def _normalised(rgb, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> np.ndarray:
    """Closed form of the preprocessing of one RGB pixel: (value / 255 − mean) / std per channel."""
    return (np.asarray(rgb, dtype=np.float64) / 255.0 - np.asarray(mean)) / np.asarray(std)


@pytest.mark.parametrize("width, height", [(50, 30), (30, 50), (24, 24)])
def test_constant_image_gives_the_normalised_colour_everywhere(tmp_path, width, height):
    """Resampling a constant image keeps it constant: every output pixel is the closed form."""
    colour = (200, 37, 90)
    path = tmp_path / "flat.png"
    Image.new("RGB", (width, height), colour).save(path)
    mean, std = (0.5, 0.25, 0.1), (0.2, 0.4, 0.8)
    x = load_image(path, size=16, resize=20, mean=mean, std=std)
    expected = _normalised(colour, mean, std)            # ((200/255 − 0.5)/0.2, …) = (1.4216, −0.2623, −0.0502)
    assert x.shape == (1, 3, 16, 16)
    np.testing.assert_allclose(x[0].reshape(3, -1).numpy(), np.repeat(expected[:, None], 256, 1), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(expected, [(200 / 255 - 0.5) / 0.2, (37 / 255 - 0.25) / 0.4, (90 / 255 - 0.1) / 0.8])


def _blocks(rows: int, cols: int, side: int = 6) -> np.ndarray:
    """An image of side×side blocks: block (i, j) has colour (20 j + 10, 30 i + 15, 200)."""
    bi, bj = np.mgrid[0:rows * side, 0:cols * side] // side
    return np.stack([20 * bj + 10, 30 * bi + 15, np.full_like(bi, 200)], -1).astype(np.uint8)


@pytest.mark.parametrize("portrait", [False, True])
def test_resize_then_center_crop_offsets(tmp_path, portrait):
    """72×36 blocks of 6 px, shorter side 36 → 18 (scale ½): 36×18; the 12×12 center crop starts at
    column (36 − 12) // 2 = 12 and row (18 − 12) // 2 = 3. Bilinear ½-downscaling mixes input pixels
    2k − 1 … 2k + 2, so resized pixel 3b + 1 lies inside block b and keeps its colour exactly:
    crop pixels 1, 4, 7, 10 are resized 13, 16, 19, 22 (block columns 4–7) and resized rows
    4, 7, 10, 13 (block rows 1–4). A crop off by one pixel lands on mixed colours."""
    arr = _blocks(6, 12)
    if portrait:                                          # the same picture turned: rows and columns swap
        arr = arr.transpose(1, 0, 2).copy()
    path = tmp_path / "blocks.png"
    Image.fromarray(arr).save(path)
    x = load_image(path, size=12, resize=18)[0].permute(1, 2, 0).numpy()
    if portrait:
        x = x.transpose(1, 0, 2)
    for k, block_row in zip((1, 4, 7, 10), (1, 2, 3, 4)):
        for m, block_col in zip((1, 4, 7, 10), (4, 5, 6, 7)):
            colour = (20 * block_col + 10, 30 * block_row + 15, 200)
            np.testing.assert_allclose(x[k, m], _normalised(colour), rtol=0, atol=1e-5, err_msg=f"pixel {k},{m}")


def test_preprocessing_matches_the_torchvision_recipe_done_by_hand(tmp_path):
    """A random 50×30 image: resize to round(50·20/30) = 33 × 20 with PIL bilinear, crop 16×16 at
    left (33 − 16) // 2 = 8, top (20 − 16) // 2 = 2, then normalise."""
    arr = np.random.default_rng(3).integers(0, 256, size=(30, 50, 3), dtype=np.uint8)
    path = tmp_path / "noise.png"
    Image.fromarray(arr).save(path)
    resized = np.asarray(Image.fromarray(arr).resize((33, 20), Image.BILINEAR), dtype=np.float64)
    expected = _normalised(resized[2:18, 8:24])
    got = load_image(path, size=16, resize=20)[0].permute(1, 2, 0).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_pixel_map_sums_over_channels():
    from rulegraph.image import pixel_map
    r = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(1, 3, 2, 4)
    expected = np.arange(24, dtype=np.float64).reshape(3, 2, 4).sum(0)      # [[24, 27, 30, 33], [36, 39, 42, 45]]
    np.testing.assert_array_equal(pixel_map(r), expected)
    np.testing.assert_array_equal(pixel_map(r[0]), expected)
    np.testing.assert_array_equal(pixel_map(r[0, 0]), r[0, 0].double().numpy())
    with pytest.raises(InputError, match="is not an image"):
        pixel_map(torch.zeros(5))


def _box(mask: np.ndarray, min_count: int = 20) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) of the pixels in ``mask``, counting only columns holding at least
    ``min_count`` of them (the heatmap's blocks are tall; the colour bar's bands are thin)."""
    columns = np.nonzero(mask.sum(0) >= min_count)[0]
    rows = np.nonzero(mask[:, columns].any(1))[0]
    return rows.min(), rows.max(), columns.min(), columns.max()


def _near(png: np.ndarray, rgb, tol: int) -> np.ndarray:
    return np.abs(png - np.asarray(rgb)).max(-1) <= tol


def _heatmap_relevance() -> torch.Tensor:
    """8×8 per-pixel relevance (summed over channels): +2 in the top-left quadrant, −1 elsewhere."""
    r = torch.zeros(1, 3, 8, 8)
    r[0, 0, :4, :4] = 1.0
    r[0, 1, :4, :4] = 1.0           # two channels: the map sums them to +2
    r[0, 2] = -1.0
    r[0, 2, :4, :4] = 0.0
    return r


def test_heatmap_colours_red_positive_blue_negative(tmp_path):
    """bwr on a symmetric scale ±max|R| = ±2: +2 is pure red (255, 0, 0) and −1, a quarter up the
    scale, is bwr(0.25) = (0.5, 0.5, 1) ≈ (128, 128, 255); row 0 of the map is at the top."""
    path = write_heatmap(_heatmap_relevance(), tmp_path / "h.png")
    png = np.asarray(Image.open(path).convert("RGB")).astype(int)
    red = _near(png, (255, 0, 0), 12)
    light_blue = _near(png, (128, 128, 255), 4)
    top, bottom, left, right = _box(light_blue)           # the whole heatmap (−1 surrounds the red quadrant)
    r_top, r_bottom, r_left, r_right = _box(red)
    side = bottom - top + 1
    assert side > 40 and abs((right - left + 1) - side) <= 2            # a square map
    assert (r_top, r_left) == (top, left)                               # red at the top-left …
    assert abs((r_bottom - r_top + 1) - side / 2) <= 2 and abs((r_right - r_left + 1) - side / 2) <= 2
    quarter = side // 4
    assert red[top + quarter, left + quarter]                             # … the centre of that quadrant
    for row, col in [(top + quarter, right - quarter), (bottom - quarter, left + quarter),
                     (bottom - quarter, right - quarter)]:
        assert light_blue[row, col], (row, col, png[row, col])
    # the colour bar right of the map runs from pure red (top) to pure blue (bottom)
    bar = _near(png, (255, 0, 0), 12) | _near(png, (0, 0, 255), 12)
    bar[:, :right + 3] = False
    rows, cols = np.nonzero(bar)
    assert len(rows) > 0
    assert tuple(png[rows.min(), cols[rows.argmin()]]) == pytest.approx((255, 0, 0), abs=12)
    assert tuple(png[rows.max(), cols[rows.argmax()]]) == pytest.approx((0, 0, 255), abs=12)


def test_heatmap_negative_maximum_is_pure_blue(tmp_path):
    """The scale is symmetric around 0: a map whose largest magnitude is negative shows it pure blue."""
    r = torch.zeros(1, 1, 6, 6)
    r[0, 0, :, :3] = -4.0
    r[0, 0, :, 3:] = 1.0             # a quarter of the bound: bwr(0.625) = (1, 0.75, 0.75)
    png = np.asarray(Image.open(write_heatmap(r, tmp_path / "b.png")).convert("RGB")).astype(int)
    blue, pink = _near(png, (0, 0, 255), 12), _near(png, (255, 191, 191), 4)
    b_top, b_bottom, b_left, b_right = _box(blue)
    p_top, p_bottom, p_left, p_right = _box(pink)
    assert (b_top, b_bottom) == (p_top, p_bottom)                       # side by side, same rows
    assert abs(p_left - (b_right + 1)) <= 1                              # blue left half, pink right half
    assert abs((b_right - b_left) - (p_right - p_left)) <= 2


def test_heatmap_beside_the_denormalised_input(tmp_path):
    """With ``image`` the left panel shows the input de-normalised with mean/std: a constant
    normalised image of (0.2, 0.6, 0.9) in [0, 1] appears as (51, 153, 230), left of the heatmap."""
    colour = np.array([0.2, 0.6, 0.9])
    image = torch.from_numpy(((colour - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD))).reshape(1, 3, 1, 1)
    image = image.expand(1, 3, 8, 8).float()
    png = np.asarray(Image.open(write_heatmap(_heatmap_relevance(), tmp_path / "p.png", image=image))
                     .convert("RGB")).astype(int)
    shown = _near(png, (51, 153, 230), 3)
    i_top, i_bottom, i_left, i_right = _box(shown)
    h_top, h_bottom, h_left, h_right = _box(_near(png, (128, 128, 255), 4))
    assert i_right < h_left                                             # input panel first
    assert i_bottom - i_top > 40 and abs((i_bottom - i_top) - (i_right - i_left)) <= 2   # a square panel
    assert h_bottom - h_top > 40 and abs((h_bottom - h_top) - (h_right - h_left)) <= 2
    assert shown[i_top:i_bottom + 1, i_left:i_right + 1].all()           # the whole panel is that colour


def write_heatmap(relevance, path, *, image=None, mean=IMAGENET_MEAN, std=IMAGENET_STD):
    """The PNG ``rulegraph explain --png`` writes for an image."""
    return save(image_figure(relevance, image, mean=mean, std=std), path)


# -- explain(model, method, image=…): the command line's preprocessing, in Python ---------------

def test_explain_takes_an_image_as_the_command_line_does(tmp_path, picture):
    """``image=`` (a path, a PIL image, an array) goes through ``--image``'s preprocessing: the model's
    16 × 16 read off its input, no ``size=`` given; the explanation keeps the pixels for ``plot``."""
    import json

    import rulegraph
    path, arr = picture
    model = cnn.onnx(cnn.build("cnn"), tmp_path / "cnn.onnx", cnn.image(1, 16))
    e = rulegraph.explain(model, "epsilon-gamma-box", image=path, dtype=torch.float64)
    out = tmp_path / "e.json"
    result = CliRunner().invoke(cli, ["explain", str(model), "--rules", "epsilon-gamma-box", "--image", str(path),
                                      "--json", str(out), "--dtype", "float64"])
    assert result.exit_code == 0, result.output
    cli_relevance = torch.tensor(json.loads(out.read_text())["relevance"]["pixel_values"], dtype=torch.float64)
    assert torch.equal(e.relevance["pixel_values"][0], cli_relevance)
    assert torch.equal(e.pixels["pixel_values"], load_image(path, size=16, resize=16))
    assert e.normalization == (IMAGENET_MEAN, IMAGENET_STD)
    for same in (Image.open(path), arr, torch.from_numpy(arr).permute(2, 0, 1), arr / 255.0):
        other = rulegraph.explain(model, "epsilon-gamma-box", image=same, dtype=torch.float64)
        assert torch.equal(other.relevance["pixel_values"], e.relevance["pixel_values"])
    figure = e.plot()
    assert [a.get_title() for a in figure.axes[:2]] == ["input", "overlay"]      # the picture, relevance over it
    shown = figure.axes[0].get_images()[0].get_array()                          # the picture, denormalised
    mean, std = (torch.tensor(v).view(3, 1, 1) for v in e.normalization)
    expected = (e.pixels["pixel_values"][0] * std + mean).permute(1, 2, 0).numpy()
    np.testing.assert_allclose(np.asarray(shown, dtype=np.float64), expected, atol=1e-6)


def test_a_vit_in_memory_takes_its_own_image_size(tmp_path, picture):
    """A 64-px ViT built in memory: the image is resized to 64 × 64 from its config, without size=."""
    from transformers import ViTConfig, ViTForImageClassification

    import rulegraph
    torch.manual_seed(0)
    vit = ViTForImageClassification(ViTConfig(image_size=64, patch_size=16, num_channels=3, hidden_size=16,
                                              num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                              num_labels=3)).eval()
    e = rulegraph.explain(vit, "attnlrp", image=picture[0])
    x = load_image(picture[0], size=64, resize=64)
    assert e.pixels["pixel_values"].shape == (1, 3, 64, 64) and torch.equal(e.pixels["pixel_values"], x)
    with torch.no_grad():
        assert e.output_value[0] == pytest.approx(float(vit(x).logits[0, e.target[0]]), abs=1e-5)
    assert e.audit.ok and e.plot() is not None


@pytest.mark.parametrize("kwargs, message", [
    ({"image": "missing.png"}, "image not found: missing.png"),
    ({"image": "x.png", "text": "w1 w2"}, "give text=… or image=…, not both"),
    ({"image": ["a.png", "b.png"]}, "image= takes one image"),
    ({"image": np.zeros((2, 4, 4, 3), np.uint8)}, "an image array is"),
    ({"image": np.full((4, 4, 3), 2.0)}, "floats in [0, 1]"),
    ({"image": 3}, "an image is a file path, a PIL image or an array"),
])
def test_a_bad_image_is_one_line_in_python_terms(tmp_path, kwargs, message, monkeypatch):
    import rulegraph
    monkeypatch.chdir(tmp_path)
    model = cnn.onnx(cnn.build("cnn"), tmp_path / "cnn.onnx", cnn.image(1, 16))
    with pytest.raises(InputError) as caught:
        rulegraph.explain(model, "epsilon-gamma-box", **kwargs)
    assert message in str(caught.value) and "\n" not in str(caught.value) and "--" not in str(caught.value)


def test_an_image_for_a_text_model_names_its_inputs(bert_onnx, picture, capsys):
    import rulegraph
    from rulegraph.cli import main
    with pytest.raises(InputError, match=r"image=… needs a model with a float \(pixel\) input; this model takes "
                                         r"input_ids, .*give text=…"):
        rulegraph.explain(bert_onnx, "attnlrp", image=picture[0])
    assert main(["explain", str(bert_onnx), "-r", "attnlrp", "--image", str(picture[0])]) == 2
    line = capsys.readouterr().err.strip()
    assert "--image needs a model with a float (pixel) input; this model takes input_ids" in line
    assert "give --text" in line and "\n" not in line
