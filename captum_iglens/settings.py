r"""
The settings of an IG-Lens run, declared once and accepted by every entry point
(:func:`~captum_iglens.attribute_text`, :func:`~captum_iglens.studies.compare`,
:func:`~captum_iglens.studies.run_batch`, :func:`~captum_iglens.studies.run_validation`
and the command line), so that each of them offers every option, and a new option
is added in one place.
"""

import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import PurePath
from typing import Any, Dict, Optional, Tuple, Union

import captum
import torch
import transformers

from captum_iglens.hf.positions import POSITIONS, Positions
from captum_iglens.version import __version__

#: A baseline that can be written down; None (``h_0``), ``"mean"`` or a number.
SettingsBaseline = Union[None, float, str]


@dataclass(frozen=True)
class Settings:
    r"""
    How IG-Lens attributes a model's answer to a prompt. Every field is checked on
    construction, so a bad setting fails before any model is loaded.

    Attributes:

        layers (tuple[int, ...], optional): Decoder block indices on the path
                    (negative ones count from the end); the last block is always
                    added. Default: None (all blocks).
        positions (str): Which tokens of ``prompt + answer`` are attributed:
                    ``"answer"``, ``"prompt"`` or ``"all"``. Default: ``"answer"``.
        baselines (None, float or str): The start of the path: None for ``h_0``,
                    ``"mean"``, or a number (see :meth:`LayerIGLens.attribute`).
                    Default: None.
        method (str, optional): The estimator, from
                    :data:`captum_iglens.ESTIMATORS`; None takes the path's
                    ``default_method`` (``"prediction_aware"`` telescoping,
                    ``"adaptive"`` joint). Default: None.
        n_steps (int, optional): Steps per segment; None takes the path's
                    ``default_steps`` (50 telescoping, 128 joint). Default:
                    None.
        granularity (str): A name in
                    :data:`~captum_iglens.attr.granularities.GRANULARITIES`:
                    ``"block"``, ``"sublayer"``, ``"head"`` (each block's
                    attention credit split across its heads), ``"source"``
                    (across the source tokens it reads), ``"source_head"`` (per
                    head and source token), ``"neuron"`` (each block's MLP
                    credit split across its neurons) or ``"expert"`` (across
                    the experts of a mixture-of-experts MLP). Default:
                    ``"block"``.
        path (str): A name in :data:`~captum_iglens.attr.paths.PATHS`:
                    ``"telescoping"`` (each block between consecutive states:
                    when the final head can *read* the answer) or ``"joint"``
                    (every block's update scaled together: what each block
                    *writes*, in no order). Default: ``"telescoping"``.
        internal_batch_size (int, optional): Rows through the readout at once.
                    Default: None (``max_chunk_bytes`` decides).
        max_chunk_bytes (int): Memory budget of one readout chunk.
                    Default: 256 MiB.
        chat (bool): Apply the tokenizer's chat template to prompts.
                    Default: True.
        max_new_tokens (int): The longest generated answer. Default: 32.
        top_k (int): With ``top_k >= 1``, results also hold what each layer
                    predicts: its ``top_k`` most probable tokens, entropy, KL
                    divergence from the model's output and the target's rank
                    (see :meth:`LayerIGLens.attribute_map`). Default: 0 (none).

    Examples::

        >>> settings = Settings(layers=(0, 10, 20), granularity="sublayer")
        >>> result = attribute_text(model, tokenizer, "Hi", settings=settings)
        >>> faster = settings.replace(method="riemann_trapezoid", n_steps=8)
    """

    layers: Optional[Tuple[int, ...]] = None
    positions: Positions = "answer"
    baselines: SettingsBaseline = None
    method: Optional[str] = None
    n_steps: Optional[int] = None
    granularity: str = "block"
    path: str = "telescoping"
    internal_batch_size: Optional[int] = None
    max_chunk_bytes: int = 256 * 2**20
    chat: bool = True
    max_new_tokens: int = 32
    top_k: int = 0

    def __post_init__(self) -> None:
        if self.layers is not None:
            if isinstance(self.layers, (str, bytes, int)):
                raise TypeError(
                    f"layers: expected a list of block indices, got {self.layers!r}"
                )
            layers = tuple(self.layers)
            if not layers or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in layers
            ):
                raise ValueError(
                    f"layers: expected a non-empty list of int block indices, got "
                    f"{self.layers!r}"
                )
            object.__setattr__(self, "layers", layers)
        if self.positions not in POSITIONS:
            raise ValueError(
                f"positions: expected one of {list(POSITIONS)}, got {self.positions!r}"
            )
        if not (
            self.baselines is None or isinstance(self.baselines, (int, float, str))
        ):
            raise TypeError(
                'baselines: expected None, "mean" or a number in Settings (pass a '
                "tensor baseline to LayerIGLens.attribute directly); got "
                f"{type(self.baselines).__name__}"
            )
        # Imported here: importing attr imports attribute_text, which takes Settings.
        from captum_iglens.attr._utils.checks import check_baselines, check_settings
        from captum_iglens.attr.estimators import estimator
        from captum_iglens.attr.granularities import GRANULARITIES, check_granularity
        from captum_iglens.attr.paths import integration_path

        check_baselines(self.baselines)
        along = integration_path(self.path)
        estimator(self.estimator).check_steps(self.steps)
        check_settings(self.internal_batch_size, False)
        check_granularity(self.granularity)
        along.check(GRANULARITIES[self.granularity], True, self.baselines is not None)
        for name in ("max_chunk_bytes", "max_new_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise ValueError(f"top_k: expected an int >= 0, got {self.top_k!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k: expected an int >= 0, got {self.top_k!r}")
        if not isinstance(self.chat, bool):
            raise TypeError(f"chat: expected a bool, got {self.chat!r}")

    @classmethod
    def resolve(
        cls, settings: Optional["Settings"], options: Dict[str, Any]
    ) -> "Settings":
        r"""``settings`` (default: ``Settings()``) with ``options``, fields of
        :class:`Settings`, applied: how every entry point reads its settings."""
        if settings is None:
            settings = cls()
        elif not isinstance(settings, cls):
            raise TypeError(
                "settings: expected a captum_iglens.Settings, got "
                f"{type(settings).__name__}"
            )
        return settings.replace(**options) if options else settings

    @property
    def steps(self) -> int:
        r"""``n_steps``, or where it is None the path's ``default_steps``."""
        from captum_iglens.attr.paths import integration_path

        if self.n_steps is None:
            return integration_path(self.path).default_steps
        return self.n_steps

    @property
    def estimator(self) -> str:
        r"""``method``, or where it is None the path's ``default_method``."""
        from captum_iglens.attr.paths import integration_path

        if self.method is None:
            return integration_path(self.path).default_method
        return self.method

    def replace(self, **changes: Any) -> "Settings":
        r"""A copy with some fields changed (checked like a new one)."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise TypeError(
                f"{', '.join(sorted(unknown))}: not a setting; settings are "
                f"{', '.join(f.name for f in fields(self))}"
            )
        return replace(self, **changes)

    def map_kwargs(self) -> Dict[str, Any]:
        r"""The keyword arguments of :meth:`LayerIGLens.attribute_map` it sets."""
        return dict(
            baselines=self.baselines,
            method=self.method,
            n_steps=self.n_steps,
            granularity=self.granularity,
            path=self.path,
            internal_batch_size=self.internal_batch_size,
            top_k=self.top_k,
        )

    def to_dict(self) -> Dict[str, Any]:
        r"""JSON-ready fields (``layers`` as a list; ``path`` only where it is
        not the default, so that records written before it existed match)."""
        data = asdict(self)
        data["layers"] = None if self.layers is None else list(self.layers)
        data["n_steps"] = self.steps
        data["method"] = self.estimator
        if self.path == type(self).path:
            del data["path"]
        return data

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "Settings":
        r"""The settings of :meth:`to_dict`; unknown fields are refused."""
        if not isinstance(data, dict):
            raise ValueError(f"settings: expected an object, got {type(data).__name__}")
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"settings: unknown field(s) {sorted(unknown)}")
        return cls(**data)


def model_name(model: str) -> str:
    r"""
    The model as results record it and pages show it: its name, never a local
    folder, which would tell whoever a file is shared with the user's paths.

    Args:

        model (str): What a result records, its config's ``_name_or_path``:
                    a hub id (``"org/name"``, kept), or a local folder.

    Returns:
        *str*: ``model``, or the last part of a local path (absolute, or
        starting with ``~``, ``./`` or ``../``): ``/home/u/.cache/x/Model`` is
        ``Model``.
    """
    local = os.path.isabs(model) or model.startswith(("~", "./", "../"))
    return PurePath(model).name if local else model


def provenance(model: Any, settings: Settings) -> Dict[str, Any]:
    r"""What a result records about how it was made: the settings, the model and
    the package versions."""
    return {
        "settings": settings.to_dict(),
        "model": model_name(
            getattr(getattr(model, "config", None), "_name_or_path", "") or ""
        )
        or type(model).__name__,
        "versions": {
            "captum_iglens": __version__,
            "captum": captum.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
    }
