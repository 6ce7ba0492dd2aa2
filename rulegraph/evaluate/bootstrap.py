"""The 95% percentile bootstrap of a mean, shared by the evaluation's table and its paired differences."""
from __future__ import annotations

import numpy as np

#: resamples per interval
BOOTSTRAP = 2000


def bootstrap(values: list[float], seed: int, resamples: int = BOOTSTRAP) -> tuple[float, float, float]:
    """Mean and 95% percentile-bootstrap interval."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), (resamples, len(v)))].mean(1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(v.mean()), float(low), float(high)
