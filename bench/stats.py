"""Latency summaries: percentiles of samples taken in nanoseconds, reported in microseconds."""

from __future__ import annotations

import numpy as np


def summary_us(samples_ns: list[int]) -> dict[str, float]:
    """p50, p99, mean and max in microseconds, and the number of samples."""
    if not samples_ns:
        return {"samples": 0}
    us = np.asarray(samples_ns, dtype=np.float64) / 1e3
    return {
        "samples": len(samples_ns),
        "p50_us": float(np.percentile(us, 50)),
        "p99_us": float(np.percentile(us, 99)),
        "mean_us": float(us.mean()),
        "max_us": float(us.max()),
    }
