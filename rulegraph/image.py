"""Images in and heatmaps out, for vision models (``rulegraph explain MODEL --image PATH``).

Preprocessing is the torchvision ImageNet convention: convert to RGB, resize the shorter
side to ``resize`` pixels (bilinear), center-crop ``size``×``size``, scale to [0, 1], then
normalise each channel as ``(x − mean) / std``. The result is a ``[1, 3, size, size]``
float32 tensor. The zB bounds of ``rules/epsilon-gamma-box.yaml`` assume these default
``mean`` / ``std``.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from .errors import InputError

if TYPE_CHECKING:       # numpy and torch are imported where used: the command line reads the constants fast
    import numpy as np
    import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: the crop size and the shorter side before it when neither the user nor the export says
DEFAULT_SIZE, DEFAULT_RESIZE = 224, 256


def preprocessing(metadata: dict[str, str], *, size: int | None = None, resize: int | None = None,
                  mean: Sequence[float] | None = None, std: Sequence[float] | None = None) -> dict:
    """:func:`load_image`'s arguments: what is given, else what the export recorded (``rulegraph export``
    writes ``rulegraph.image_size`` ``[C, H, W]`` and its image processor's ``rulegraph.image_mean`` /
    ``rulegraph.image_std``; the image is then resized straight to the model's size), else ImageNet's.
    The keys are read as :func:`rulegraph.loaders.metadata.parse` reads them (a bad one is a :class:`ModelError`)."""
    from .loaders.metadata import parse

    info = parse(metadata)
    shape = list(info.image_size) if info.image_size is not None else None
    if size is None and shape is not None:
        if len(shape) != 3 or shape[1] != shape[2]:
            raise InputError(f"the export takes {shape} images; give a square --size for the crop")
        size = int(shape[1])
        resize = size if resize is None else resize
    size = size or DEFAULT_SIZE
    return dict(size=size, resize=resize or DEFAULT_RESIZE,
                mean=tuple(mean or info.image_mean or IMAGENET_MEAN),
                std=tuple(std or info.image_std or IMAGENET_STD))


def load_image(path: str | Path, *, size: int = 224, resize: int | None = 256,
               mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> torch.Tensor:
    """The image at ``path`` preprocessed (see the module docstring) as ``[1, 3, size, size]``."""
    import numpy as np
    import torch

    from PIL import Image, UnidentifiedImageError

    if len(mean) != 3 or len(std) != 3:
        raise InputError(f"mean and std need 3 values (R, G, B), got {len(mean)} and {len(std)}")
    if any(s <= 0 for s in std):
        raise InputError(f"std values must be positive, got {list(std)}")
    try:
        img = Image.open(path).convert("RGB")
    except FileNotFoundError:
        raise InputError(f"image not found: {path}") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise InputError(f"cannot read {path} as an image: {exc}") from None
    resize = resize or size
    if resize < size:
        raise InputError(f"resize ({resize}) must be at least the crop size ({size})")
    w, h = img.size
    scale = resize / min(w, h)
    img = img.resize((max(resize, round(w * scale)), max(resize, round(h * scale))), Image.BILINEAR)
    w, h = img.size
    left, top = (w - size) // 2, (h - size) // 2
    img = img.crop((left, top, left + size, top + size))
    x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)
    x = (x - torch.tensor(mean).reshape(3, 1, 1)) / torch.tensor(std).reshape(3, 1, 1)
    return x.unsqueeze(0).float()


def pixel_map(relevance: torch.Tensor) -> np.ndarray:
    """``[H, W]`` relevance per pixel: the sum over channels of a ``[(1,) C, H, W]`` tensor."""
    r = relevance.detach().double().cpu()
    if r.dim() == 4:
        r = r[0]
    if r.dim() == 3:
        r = r.sum(0)
    if r.dim() != 2:
        raise InputError(f"relevance of shape {tuple(relevance.shape)} is not an image ([C, H, W])")
    return r.numpy()


