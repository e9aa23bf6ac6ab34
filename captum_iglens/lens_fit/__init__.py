r"""Fitted per-layer readouts: linear shortcuts fitted in closed form on text the
model samples itself (streamed float64 Gram matrices, ridge), an optional KL
fine-tune, the held-out report (KL and top-1 agreement beside the logit lens),
tuned-lens checkpoint folders, and the per-model cache."""

from captum_iglens.lens_fit.cache import lens_cache_folder
from captum_iglens.lens_fit.fit import (
    FitOptions,
    FittedLens,
    cache_fit,
    cached_lens,
    fit_lens,
    save_fit,
)
from captum_iglens.lens_fit.gram import GramStats, solve_ridge
from captum_iglens.lens_fit.quality import Quality, lens_quality
from captum_iglens.lens_fit.report import LensFitReport

__all__ = [
    "cache_fit",
    "cached_lens",
    "fit_lens",
    "FitOptions",
    "FittedLens",
    "GramStats",
    "lens_cache_folder",
    "lens_quality",
    "LensFitReport",
    "Quality",
    "save_fit",
    "solve_ridge",
]
