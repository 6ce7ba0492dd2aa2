"""Images in and heatmaps out, for vision models (``rulegraph explain MODEL --image PATH``, and
``rulegraph.explain(model, method, image=…)``: both through :func:`image_input`).

The tensor is built as the model takes it: its layout (NCHW or NHWC, 1 or 3 channels) and its
height × width are read from the graph input's declared shape (:func:`layout_of`), else from what
``rulegraph export`` recorded (``rulegraph.image_size``), else the ImageNet defaults.

Preprocessing is the torchvision ImageNet convention: convert to RGB (or grey for one channel),
resize bilinearly so that the image covers the model's H × W with its shorter side scaled to
``resize`` (default: the model's own size), center-crop H × W, scale to [0, 1], then normalise each
channel as ``(x − mean) / std``. A side the model leaves free (a text-line recognizer's width)
is not cropped: the image is resized to the fixed side and keeps its aspect ratio. Whatever was
resized or cropped is said (:func:`load`'s note). The zB bounds of ``rules/epsilon-gamma-box.yaml``
assume the default ``mean`` / ``std``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from .errors import InputError

if TYPE_CHECKING:       # numpy and torch are imported where used: the command line reads the constants fast
    import numpy as np
    import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: the crop size and the shorter side before it when neither the user, the graph nor the export says
DEFAULT_SIZE, DEFAULT_RESIZE = 224, 256
#: the channel counts an image input may have
CHANNELS = (1, 3)
SIZE_FORMS = "N (a square) or H,W (e.g. 80,160)"


@dataclass(frozen=True)
class Layout:
    """How a model takes an image: channels last (NHWC) or first (NCHW), how many, and the
    height and width it fixes (``None``: free)."""

    channels_last: bool = False
    channels: int = 3
    height: int | None = None
    width: int | None = None

    @property
    def name(self) -> str:
        return "NHWC" if self.channels_last else "NCHW"


@dataclass(frozen=True)
class ImageInput:
    """An image as a model takes it: the graph input it fills, the tensor, the layout, the per-channel
    normalization it was preprocessed with, and what was done to it (:func:`load`'s note)."""

    name: str
    tensor: "torch.Tensor"
    layout: Layout
    mean: tuple
    std: tuple
    note: str

    def describe(self) -> str:
        """One line: the input, its layout and shape, what was done to the image."""
        return f"{self.name} {self.layout.name} {'×'.join(map(str, self.tensor.shape))}: {self.note}"


def image_input(graph, image, *, size=None, resize: int | None = None, mean: Sequence[float] | None = None,
                std: Sequence[float] | None = None) -> ImageInput:
    """``image`` (a path, a PIL image or an array, :func:`load`) preprocessed for ``graph``'s pixel input
    (its first float input): the layout and sides it declares, else the export's recorded size and
    normalization (:func:`preprocessing`). The one preprocessing of ``rulegraph explain --image`` and
    ``rulegraph.explain(…, image=…)``; a model without a float input is refused naming its inputs."""
    pixels = next((i for i in graph.inputs if i.is_float), None)
    if pixels is None:
        names = ", ".join(graph.input_names)
        raise InputError(f"image=… needs a model with a float (pixel) input; this model takes {names} "
                         "(give text=… or inputs=…)",
                         cli=f"--image needs a model with a float (pixel) input; this model takes {names} (give --text)")
    layout = layout_of(pixels.name, pixels.shape)
    pre = preprocessing(graph.metadata, size=size, resize=resize, mean=mean, std=std, layout=layout)
    x, note = load(image, **pre)
    return ImageInput(pixels.name, x, layout, pre["mean"], pre["std"], note)


def _fixed(d) -> int | None:
    return d if isinstance(d, int) and d > 0 else None


def layout_of(name: str, shape: Sequence | None) -> Layout:
    """The :class:`Layout` of an input of declared ``shape`` ``[N, C, H, W]`` or ``[N, H, W, C]``
    (C 1 or 3; a free channel axis is read as NCHW with 3). A shape that is no image is refused."""
    if shape is None:
        return Layout()
    shape = tuple(shape)
    if len(shape) != 4:
        what = (f"input {name} has shape {list(shape)}, not an image's [N, C, H, W] (NCHW) or [N, H, W, C] "
                "(NHWC) with C = 1 or 3")
        raise InputError(f"image=…: {what}", cli=f"--image: {what}")
    first, last = _fixed(shape[1]), _fixed(shape[3])
    if first in CHANNELS or (first is None and last not in CHANNELS):
        return Layout(False, first or 3, _fixed(shape[2]), _fixed(shape[3]))
    if last in CHANNELS:
        return Layout(True, last, _fixed(shape[1]), _fixed(shape[2]))
    what = f"input {name} has shape {list(shape)}: no 1 or 3 channels on axis 1 (NCHW) or axis 3 (NHWC)"
    raise InputError(f"image=…: {what}", cli=f"--image: {what}")


def parse_size(text: str | int | Sequence[int] | None) -> tuple[int, int] | None:
    """``--size``: ``N`` (N × N) or ``H,W``, as ``(H, W)``; another form is refused naming the valid ones."""
    if text is None:
        return None
    if isinstance(text, int):
        parts = [text]
    elif isinstance(text, str):
        try:
            parts = [int(p) for p in text.replace("x", ",").replace("×", ",").split(",")]
        except ValueError:
            parts = []
    else:
        parts = list(text)
    if len(parts) not in (1, 2) or any(not isinstance(p, int) or p < 1 for p in parts):
        raise InputError(f"--size {text!r}: give {SIZE_FORMS}, positive integers")
    return (parts[0], parts[-1])


def preprocessing(metadata: dict[str, str], *, size=None, resize: int | None = None,
                  mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                  layout: Layout | None = None) -> dict:
    """:func:`load_image`'s arguments: what is given, else the graph input's ``layout`` (its
    fixed sides), else what the export recorded (``rulegraph export`` writes ``rulegraph.image_size``
    ``[C, H, W]`` and its image processor's ``rulegraph.image_mean`` / ``rulegraph.image_std``), else
    ImageNet's. ``size`` is ``N`` or ``(H, W)`` (:func:`parse_size`); a model's own size is resized to
    straight (``resize`` its shorter side), the defaults crop 224 from 256. ``size`` in the result is
    ``(H, W)``, ``None`` for a side left free. The metadata keys are read as
    :func:`rulegraph.loaders.metadata.parse` reads them (a bad one is a :class:`ModelError`)."""
    from .loaders.metadata import parse

    info = parse(metadata)
    layout = layout or Layout()
    hw = parse_size(size)
    if hw is not None and any(fixed not in (None, given) for fixed, given in zip((layout.height, layout.width), hw)):
        raise InputError(f"--size {hw[0]},{hw[1]}: the model's input takes {layout.height or 'any'} × "
                         f"{layout.width or 'any'} (H × W); give that size, or leave --size out")
    if hw is None and (layout.height or layout.width):
        hw = (layout.height, layout.width)
    if hw is None and info.image_size is not None:
        hw = (int(info.image_size[1]), int(info.image_size[2]))
    if hw is None:
        hw, resize = (DEFAULT_SIZE, DEFAULT_SIZE), resize or DEFAULT_RESIZE
    channels = layout.channels
    mean = tuple(mean or info.image_mean or IMAGENET_MEAN)
    std = tuple(std or info.image_std or IMAGENET_STD)
    if channels == 1:               # a grey model: one value, the mean of the R, G, B ones given
        mean, std = (sum(mean) / len(mean),), (sum(std) / len(std),)
    return dict(size=hw, resize=resize, mean=mean, std=std, channels_last=layout.channels_last)


def load(path, *, size=224, resize: int | None = 256, mean: Sequence[float] = IMAGENET_MEAN,
         std: Sequence[float] = IMAGENET_STD, channels_last: bool = False) -> tuple[torch.Tensor, str]:
    """The image ``path`` (a file path, a PIL image, or an array of pixels as :func:`_picture` reads
    it) preprocessed (see the module docstring) as ``[1, C, H, W]`` (or ``[1, H, W, C]``,
    ``channels_last``), C the length of ``mean``, and a note of what was done to it: the sizes,
    resized and cropped or not."""
    import numpy as np
    import torch

    from PIL import Image

    if isinstance(size, int):
        size = (size, size)
    height, width = size
    channels = len(mean)
    if channels not in CHANNELS or len(std) != channels:
        raise InputError(f"mean and std need 3 values (R, G, B), or 1 for a grey model; got {len(mean)} and {len(std)}")
    if any(s <= 0 for s in std):
        raise InputError(f"std values must be positive, got {list(std)}")
    img = _picture(path).convert("RGB" if channels == 3 else "L")
    w, h = img.size
    if height is None and width is None:
        raise InputError("the model fixes neither the height nor the width of its image: preprocess it with "
                         "rulegraph.image.load_image(image, size=N or (H, W)) and give it as inputs={name: tensor}",
                         cli="--image: the model fixes neither height nor width; give --size " + SIZE_FORMS)
    if height is None or width is None:       # a free side: resize to the fixed one, keep the aspect ratio
        scale = height / h if height is not None else width / w
        height, width = height or max(1, round(h * scale)), width or max(1, round(w * scale))
        img = img.resize((width, height), Image.BILINEAR)
        note = (f"W×H {w}×{h} resized to {width}×{height} (to the {'height' if size[0] else 'width'} the model "
                "fixes; the aspect ratio kept, no crop)")
    else:
        short = min(height, width)
        resize = resize or short
        if resize < short:
            raise InputError(f"resize ({resize}) must be at least the crop size ({short})")
        scale = max(height / h, width / w) * resize / short
        rw, rh = max(width, round(w * scale)), max(height, round(h * scale))
        if (rw, rh) != (w, h):
            img = img.resize((rw, rh), Image.BILINEAR)
        left, top = (rw - width) // 2, (rh - height) // 2
        img = img.crop((left, top, left + width, top + height))
        done = [f"resized to {rw}×{rh}"] if (rw, rh) != (w, h) else []
        if (rw, rh) != (width, height):
            done.append(f"center-cropped to {width}×{height} ({rw - width} columns and {rh - height} rows cut: "
                        "the model fixes both sides)")
        note = f"W×H {w}×{h} " + (", then ".join(done) or "taken as it is")
    a = np.asarray(img, dtype=np.float32) / 255.0
    x = torch.from_numpy(a.reshape(height, width, channels))
    x = (x - torch.tensor(mean)) / torch.tensor(std)
    x = x if channels_last else x.permute(2, 0, 1)
    return x.unsqueeze(0).float().contiguous(), note


def _picture(image):
    """``image`` as a PIL image: a file path (opened), a PIL image, or an array (numpy or torch) of
    pixels ``[H, W]``, ``[H, W, C]`` (C 1, 3 or 4, as PIL and imageio give them) or ``[C, H, W]``
    (C 1 or 3, as torch does), uint8 0–255 or float 0–1 (read as 8 bits, as an image file holds them)."""
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, Image.Image):
        return image
    if isinstance(image, (str, Path)):
        try:
            picture = Image.open(image)
            picture.load()
            return picture
        except FileNotFoundError:
            raise InputError(f"image not found: {image}") from None
        except (UnidentifiedImageError, OSError) as exc:
            raise InputError(f"cannot read {image} as an image: {exc}") from None
    if not (hasattr(image, "shape") and hasattr(image, "dtype")):
        raise InputError(f"an image is a file path, a PIL image or an array of pixels, got a {type(image).__name__}")
    a = image.detach().cpu().numpy() if hasattr(image, "detach") else np.asarray(image)
    if a.ndim == 3 and a.shape[0] in CHANNELS and a.shape[2] not in (*CHANNELS, 4):
        a = a.transpose(1, 2, 0)                    # [C, H, W] → [H, W, C]
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[..., 0]
    if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] not in (3, 4)):
        raise InputError(f"an image array is [H, W], [H, W, C] (C 1, 3 or 4) or [C, H, W] (C 1 or 3), got shape "
                         f"{list(a.shape)}; for a preprocessed tensor give inputs={{name: tensor}}")
    if a.dtype == np.uint8:
        return Image.fromarray(a)
    if a.dtype.kind != "f" or a.size == 0 or not np.isfinite(a).all() or a.min() < 0 or a.max() > 1:
        raise InputError(f"an image array holds uint8 pixels (0–255) or floats in [0, 1], got {a.dtype} "
                         + (f"from {a.min():.3g} to {a.max():.3g}" if a.dtype.kind == "f" and a.size else ""))
    return Image.fromarray(np.rint(a * 255).astype(np.uint8))


def load_image(path: str | Path, **kwargs) -> torch.Tensor:
    """The image at ``path`` preprocessed as :func:`load` does, without the note."""
    return load(path, **kwargs)[0]


def image_axes(shape: Sequence[int]) -> tuple[int, int] | None:
    """Where an image-shaped tensor keeps its channels, as ``(batch axis or -1, channel axis)``:
    4-D with 1 or 3 channels on axis 1 (NCHW) or 3 (NHWC), 3-D with 3 on axis 0 or 2; else ``None``."""
    shape = tuple(shape)
    if len(shape) == 4:
        return (0, 1) if shape[1] in CHANNELS else (0, 3) if shape[3] in CHANNELS else None
    if len(shape) == 3:
        return (-1, 0) if shape[0] == 3 else (-1, 2) if shape[2] == 3 else None
    return None


def is_image(tensor) -> bool:
    """Whether a float relevance tensor is shown as an image: a 4-D one (NCHW or NHWC by
    :func:`image_axes`, else read as NCHW). A 3-D one is not, whatever its sizes: a token boundary is
    ``[batch, positions, hidden]``, and a batch of 3 texts (or a hidden size of 3) would read as CHW / HWC."""
    return tensor.is_floating_point() and tensor.dim() == 4


def to_chw(x: torch.Tensor, item: int = 0) -> torch.Tensor:
    """Batch item ``item`` of an image-shaped tensor (:func:`image_axes`) as ``[C, H, W]``."""
    axes = image_axes(x.shape) or ((0, 1) if x.dim() == 4 else None)         # other channel counts: NCHW
    if axes is None:
        raise InputError(f"a tensor of shape {tuple(x.shape)} is not an image ([N, C, H, W], [N, H, W, C] "
                         "with C = 1 or 3, or [3, H, W] / [H, W, 3])")
    batch, channel = axes
    if batch >= 0:
        x, channel = x[item], channel - 1
    return x if channel == 0 else x.permute(2, 0, 1)


def pixel_map(relevance: torch.Tensor, item: int = 0) -> np.ndarray:
    """``[H, W]`` relevance per pixel: the sum over channels of an image-shaped tensor (NCHW, NHWC,
    CHW or HWC, :func:`image_axes`), or a ``[H, W]`` one as it is."""
    r = relevance.detach().double().cpu()
    if r.dim() == 2:
        return r.numpy()
    if image_axes(r.shape) is None and r.dim() == 3:      # other channel counts: read as CHW
        return r.sum(0).numpy()
    return to_chw(r, item).sum(0).numpy()
