"""A model and ≥ 50 texts for the dataset-scale tests: the demo model when `make demo` has built
it (as in CI), else the bag-of-words ONNX model (exact answers known)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

import bow

DEMO = Path(os.environ.get("RULEGRAPH_CACHE", Path(__file__).resolve().parents[2] / ".cache")) / "sentiment-minilm"
WORDS = ["a", "gorgeous", "witty", "movie", "the", "plot", "is", "thin", "and", "jokes", "fall", "flat",
         "charming", "often", "affecting", "journey", "dull", "bright", "cast", "story"]


def texts(vocabulary: list[str], n: int = 56) -> list[str]:
    """``n`` texts of 3…14 words, deterministic, of varied lengths (so batches are bucketed)."""
    return [" ".join(vocabulary[(7 * i + 3 * j) % len(vocabulary)] for j in range(3 + (5 * i) % 12))
            for i in range(n)]


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """(model.onnx, texts, which): the demo model if cached, else the bag-of-words model."""
    if (DEMO / "metrics.json").exists():
        return DEMO / "model.onnx", texts(WORDS), "demo"
    return bow.build(tmp_path_factory.mktemp("bow_scale")), texts([f"w{i}" for i in range(1, 40)]), "bow"
