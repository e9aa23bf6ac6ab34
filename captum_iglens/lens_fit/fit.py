r"""
Fitting a lens: linear shortcuts in closed form on a corpus that needs no
download, optionally KL-tuned, reported on held-out rows
(:func:`fit_lens`), and written as a tuned-lens checkpoint folder
(:func:`save_fit`).
"""

import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor
from tqdm import tqdm

from captum_iglens.hf.checksum import weights_checksum
from captum_iglens.hf.parts import ModelParts
from captum_iglens.lens_fit.cache import lens_cache_folder
from captum_iglens.lens_fit.checkpoint import save_lens_folder
from captum_iglens.lens_fit.corpus import (
    corpus_windows,
    record_windows,
    sample_batch,
)
from captum_iglens.lens_fit.gram import GramStats, solve_ridge
from captum_iglens.lens_fit.options import FitOptions
from captum_iglens.lens_fit.quality import Quality, lens_quality
from captum_iglens.lens_fit.report import LensFitReport
from captum_iglens.lens_fit.states import StateRecorder
from captum_iglens.lens_fit.tune import kl_tune
from captum_iglens.readout.translators import (
    TUNED_LENS_TYPE,
    Translators,
    unembedding_hash,
)

#: The ``lens_type`` of linear shortcuts fitted in closed form (Din et al.).
LINEAR_SHORTCUT = "linear_shortcut"


class _Collector:
    """Routes recorded rows: the first sequences to the held-out set, the rest
    into the Gram sums (snapshotted at the curve's sizes) and the tuning rows."""

    def __init__(self, parts: ModelParts, options: FitOptions, bar: tqdm) -> None:
        model: Any = parts.model  # a Hugging Face model, untyped
        width = model.get_input_embeddings().weight.shape[1]
        self.options, self.bar = options, bar
        self.stats = GramStats(len(parts.blocks), width)
        self.snapshots: Dict[int, GramStats] = {}
        self.held: List[Tensor] = []
        self.tuning: List[Tensor] = []
        self.held_rows = self.tune_rows = 0
        self.start = self.sequences = 0
        self.eval_sequences = 0

    @property
    def done(self) -> bool:
        return self.stats.rows >= self.options.tokens

    def next_batch(self, size: int) -> None:
        self.start, self.sequences = self.sequences, self.sequences + size

    def __call__(self, states: Tensor, keep: Tensor) -> None:
        index = self.start + torch.arange(states.shape[1])
        held = index < self.eval_sequences
        self._hold(states[:, held][:, keep[held]])
        self._fit(states[:, ~held][:, keep[~held]])

    def _hold(self, rows: Tensor) -> None:
        rows = rows[:, : self.options.eval_tokens - self.held_rows]
        if rows.shape[1]:
            self.held.append(rows)
            self.held_rows += rows.shape[1]

    def _fit(self, rows: Tensor) -> None:
        rows = rows[:, : self.options.tokens - self.stats.rows]
        if self.options.kl_steps and self.tune_rows < self.options.kl_tokens:
            kept = rows[:, : self.options.kl_tokens - self.tune_rows]
            self.tuning.append(kept.clone())
            self.tune_rows += kept.shape[1]
        for size in sorted(self.options.curve):
            if self.stats.rows < size <= self.stats.rows + rows.shape[1]:
                cut = size - self.stats.rows
                self.stats.add(rows[:, :cut])
                self.snapshots[size] = self.stats.copy()
                rows = rows[:, cut:]
                self.bar.update(cut)
        if rows.shape[1]:
            self.stats.add(rows)
            self.bar.update(rows.shape[1])


def _collect(
    parts: ModelParts, tokenizer: Any, options: FitOptions, collector: _Collector
) -> None:
    """Samples (or reads) sequences until the fitting rows are there."""
    if options.corpus is None:
        collector.eval_sequences = math.ceil(options.eval_tokens / (options.length - 1))
        with (
            torch.random.fork_rng(devices=[]),
            StateRecorder(parts, collector) as recorder,
        ):
            torch.manual_seed(options.seed)
            while not collector.done:
                collector.next_batch(options.batch)
                sample_batch(parts, tokenizer, recorder, options.batch, options.length)
        return
    windows = corpus_windows(tokenizer, options.corpus, options.length)
    counts = torch.tensor([len(w) - 1 for w in windows] or [0]).cumsum(0)
    collector.eval_sequences = int((counts < options.eval_tokens).sum()) + 1
    with StateRecorder(parts, collector, stop=True) as recorder:
        for start in range(0, len(windows), options.batch):
            if collector.done:
                break
            chunk = windows[start : start + options.batch]
            collector.next_batch(len(chunk))
            record_windows(parts, tokenizer, recorder, chunk)
    if collector.stats.rows < 2 or not collector.held_rows:
        raise ValueError(
            f"corpus: {collector.held_rows + collector.stats.rows} usable tokens; "
            f"expected more than eval_tokens={options.eval_tokens} and at least 2 "
            "more to fit on"
        )


@dataclass
class FittedLens:
    r"""
    Fitted translators and their report.

    Attributes:

        weight (Tensor): ``(L, d, d)`` float32, the deltas from the identity
                    (the translator of state ``i`` is ``h + h Wᵢᵀ + bᵢ``).
        bias (Tensor): ``(L, d)`` float32.
        report (LensFitReport): The held-out quality and settings.
        curve (dict[int, tuple[Tensor, Tensor]]): The closed form fitted on the
                    first ``n`` rows, per curve size ``n``.
    """

    weight: Tensor
    bias: Tensor
    report: LensFitReport
    curve: Dict[int, Tuple[Tensor, Tensor]] = field(default_factory=dict)


def fit_lens(
    parts: ModelParts,
    tokenizer: Any,
    options: FitOptions = FitOptions(),
    *,
    model_name: str = "",
    progress: bool = False,
) -> FittedLens:
    r"""
    Fits linear shortcuts ``h_i ↦ h_i M_i + b_i ≈ h_L`` in closed form
    (Din et al. 2023) for every state ``h_0 … h_{L−1}``, read with the model's
    own final norm and head, on text the model samples (or ``options.corpus``),
    then optionally KL-tunes them; reports KL and top-1 agreement on held-out
    rows beside the logit lens.

    Args:

        parts (ModelParts): The model's parts (weights and mode unchanged; no
                    hook stays).
        tokenizer (PreTrainedTokenizerBase): Its tokenizer.
        options (FitOptions, optional): See :class:`FitOptions`.
        model_name (str, optional): The name recorded in the report and config.
        progress (bool, optional): Progress bars on stderr. Default: False

    Returns:
        :class:`FittedLens`.
    """
    options.check()
    seconds: Dict[str, float] = {}
    tick = time.perf_counter()
    checksum = weights_checksum(parts.model)
    readout = parts.readout()
    with tqdm(
        total=options.tokens,
        desc="fitting tokens",
        unit="tok",
        file=sys.stderr,
        disable=not progress,
    ) as bar:
        collector = _Collector(parts, options, bar)
        _collect(parts, tokenizer, options, collector)
    seconds["corpus"] = time.perf_counter() - tick
    weight, bias = solve_ridge(collector.stats, options.ridge)
    curve = {n: solve_ridge(s, options.ridge) for n, s in collector.snapshots.items()}
    held = torch.cat(collector.held, 1)
    qualities = {"logit": lens_quality(readout, held)}
    if options.kl_steps:
        qualities["closed_form"] = lens_quality(
            readout, held, Translators(weight, bias)
        )
        tick = time.perf_counter()
        with tqdm(
            total=options.kl_steps,
            desc="KL fine-tune",
            unit="step",
            file=sys.stderr,
            disable=not progress,
        ) as bar:
            weight, bias = kl_tune(
                readout,
                torch.cat(collector.tuning, 1),
                weight,
                bias,
                steps=options.kl_steps,
                lr=options.kl_lr,
                batch=options.kl_batch,
                seed=options.seed,
                progress=bar,
            )
        seconds["kl_tune"] = time.perf_counter() - tick
    tick = time.perf_counter()
    qualities["fitted"] = lens_quality(readout, held, Translators(weight, bias))
    points = [
        _curve_point(n, lens_quality(readout, held, Translators(*wb)))
        for n, wb in sorted(curve.items())
    ]
    seconds["evaluate"] = time.perf_counter() - tick
    settings = {k: v for k, v in asdict(options).items() if k != "corpus"}
    settings.update(
        corpus="sampled" if options.corpus is None else "file",
        unembed_sha256=unembedding_hash(parts.head),
        fit_tokens=collector.stats.rows,
        eval_tokens=held.shape[1],
        seconds=seconds,
    )
    report = LensFitReport(
        model=model_name or _model_name(parts),
        checksum=checksum,
        states=["emb", *(str(i) for i in range(len(parts.blocks)))],
        kl={k: q.kl.tolist() for k, q in qualities.items()},
        top1={k: q.top1.tolist() for k, q in qualities.items()},
        curve=points,
        settings=settings,
    )
    return FittedLens(weight, bias, report, curve)


def cached_lens(
    parts: ModelParts,
    tokenizer: Any,
    *,
    cache_dir: Optional[Any] = None,
    progress: bool = False,
) -> Path:
    r"""
    The folder of the model's cached default fit (``lenses/<checksum>/`` under
    the cache root, as ``captum-iglens fit-lens`` writes it), fitted first with
    :class:`FitOptions`'s defaults and cached when there is none: the lens that
    ``--lens linear`` reads.

    Args:

        parts (ModelParts): The model's parts.
        tokenizer (PreTrainedTokenizerBase): Its tokenizer (for the sampling).
        cache_dir (str or Path, optional): The cache root, as in
                    :func:`~captum_iglens.hf.models.load_embedded`. Default: None
        progress (bool, optional): Progress bars while fitting. Default: False

    Returns:
        *Path*: a tuned-lens folder (``params.pt``, ``config.json``).
    """
    folder = lens_cache_folder(weights_checksum(parts.model), cache_dir)
    if not (folder / "params.pt").is_file():
        if progress:
            print(
                f"no fitted lens cached for this model: fitting {folder}",
                file=sys.stderr,
            )
        cache_fit(
            fit_lens(parts, tokenizer, FitOptions(), progress=progress), cache_dir
        )
    return folder


def cache_fit(fitted: FittedLens, cache_dir: Optional[Any] = None) -> Path:
    r"""
    Writes a fit made with :class:`FitOptions`'s defaults as its model's cached
    lens (see :func:`~captum_iglens.lens_fit.cache.lens_cache_folder`).

    Args:

        fitted (FittedLens): From :func:`fit_lens` with the default options.
        cache_dir (str or Path, optional): The cache root. Default: None

    Returns:
        *Path*: the cached lens folder.
    """
    folder = lens_cache_folder(fitted.report.checksum, cache_dir)
    folder.parent.mkdir(parents=True, exist_ok=True)
    save_fit(folder, fitted)
    return folder


def _curve_point(tokens: int, quality: Quality) -> Dict[str, Any]:
    return {"tokens": tokens, "kl": quality.kl.tolist(), "top1": quality.top1.tolist()}


def _model_name(parts: ModelParts) -> str:
    config: Any = parts.model.config  # a Hugging Face config, untyped
    return str(getattr(config, "_name_or_path", "") or config.model_type)


def translators_of(
    fitted: "FittedLens", weight: Tensor, bias: Tensor, tuned: bool
) -> Translators:
    r"""
    Fitted ``weight`` and ``bias`` as
    :class:`~captum_iglens.readout.translators.Translators` that record the
    model they were fitted on (name, unembedding hash, weights' checksum).

    Args:

        fitted (FittedLens): The fit (for its report).
        weight (Tensor): ``(L, d, d)`` deltas.
        bias (Tensor): ``(L, d)``.
        tuned (bool): KL-tuned (``lens_type`` ``"linear_tuned_lens"``, read as a
                    ``"tuned"`` readout), else the closed form
                    (``"linear_shortcut"``, a ``"linear"`` readout).

    Returns:
        *Translators*.
    """
    report = fitted.report
    return Translators(
        weight,
        bias,
        base_model=report.model,
        unembed_sha256=report.settings["unembed_sha256"],
        lens_type=TUNED_LENS_TYPE if tuned else LINEAR_SHORTCUT,
        extra={
            "model_checksum": report.checksum,
            "fitted_by": "captum-iglens fit-lens",
        },
    )


def save_fit(folder: Any, fitted: FittedLens, curve_folders: bool = False) -> None:
    r"""
    Writes a fit as a tuned-lens checkpoint folder (``params.pt``,
    ``config.json``) with ``fit_report.json`` and the figure ``fit_report.png``,
    atomically; with ``curve_folders``, also each curve size's closed form as
    ``<folder>-tokens<n>``.

    Args:

        folder (str or Path): The lens folder; its parent must exist.
        fitted (FittedLens): From :func:`fit_lens`.
        curve_folders (bool, optional): Also write the curve's lenses.
                    Default: False
    """
    folder = Path(folder)
    report = fitted.report
    extra = {
        "fit_report.json": report.save,
        "fit_report.png": lambda p: report.plot()[0].savefig(p, dpi=110),
    }
    tuned = bool(report.settings["kl_steps"])
    main = translators_of(fitted, fitted.weight, fitted.bias, tuned)
    save_lens_folder(folder, main, extra)
    for n, (weight, bias) in fitted.curve.items() if curve_folders else ():
        save_lens_folder(
            folder.with_name(f"{folder.name}-tokens{n}"),
            translators_of(fitted, weight, bias, tuned=False),
            {},
        )
