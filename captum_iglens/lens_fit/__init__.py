r"""Fitted per-layer readouts: linear shortcuts fitted in closed form on text the
model samples itself (streamed float64 Gram matrices, ridge), an optional KL
fine-tune, the held-out report (KL and top-1 agreement beside the logit lens),
tuned-lens checkpoint folders, and the per-model cache."""

from typing import TYPE_CHECKING

from captum_iglens._utils.lazy import lazy_exports

if TYPE_CHECKING:
    from captum_iglens.lens_fit.cache import lens_cache_folder
    from captum_iglens.lens_fit.fit import (
        FittedLens,
        cache_fit,
        cached_lens,
        fit_lens,
        save_fit,
    )
    from captum_iglens.lens_fit.options import FitOptions
    from captum_iglens.lens_fit.gram import GramStats, solve_ridge
    from captum_iglens.lens_fit.quality import Quality, lens_quality
    from captum_iglens.lens_fit.report import LensFitReport

# Each public name is imported from its module on first use.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "lens_cache_folder": "captum_iglens.lens_fit.cache",
        "FitOptions": "captum_iglens.lens_fit.options",
        "FittedLens": "captum_iglens.lens_fit.fit",
        "cache_fit": "captum_iglens.lens_fit.fit",
        "cached_lens": "captum_iglens.lens_fit.fit",
        "fit_lens": "captum_iglens.lens_fit.fit",
        "save_fit": "captum_iglens.lens_fit.fit",
        "GramStats": "captum_iglens.lens_fit.gram",
        "solve_ridge": "captum_iglens.lens_fit.gram",
        "Quality": "captum_iglens.lens_fit.quality",
        "lens_quality": "captum_iglens.lens_fit.quality",
        "LensFitReport": "captum_iglens.lens_fit.report",
    },
)

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
