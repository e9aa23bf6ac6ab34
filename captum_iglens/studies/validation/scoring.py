r"""
Per-layer scores of the first answer token for the validation studies, from the
methods' runners (:mod:`~captum_iglens.studies.methods.registry`): one IG-Lens
pass gives IG-Lens's and the logit lens's outcomes, which the study's
:class:`~captum_iglens.studies.methods.runners.Work` keeps so that no runner
makes that pass again.
"""

from typing import Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from captum_iglens.attr.layer_ig_lens import LayerIGLens
from captum_iglens.hf.parts import ModelParts
from captum_iglens.settings import Settings
from captum_iglens.studies.methods.registry import METHODS, outcome
from captum_iglens.studies.methods.runners import (
    Work,
    ig_lens_outcome,
    logit_lens_diff_outcome,
    logit_lens_outcome,
)


def study_work(
    parts: ModelParts,
    ig_lens: LayerIGLens,
    ids: Tensor,
    mask: Tensor,
    settings: Settings,
    baseline_token: int,
    learned: Optional[LayerIGLens] = None,
) -> Tuple[Work, Tensor]:
    r"""
    The work of the model's greedy next token at the last position, with the
    outcomes of ``"ig_lens"``, ``"logit_lens"`` and ``"logit_lens_diff"`` read
    from one IG-Lens pass (a second one, from ``h_0``, only when the settings
    choose another baseline).

    Args:

        parts (ModelParts): The causal LM's parts.
        ig_lens (LayerIGLens): IG-Lens on the study's blocks.
        ids (Tensor): ``(B, T)`` token ids, left-padded.
        mask (Tensor): ``(B, T)``, zeros at padding.
        settings (Settings): IG-Lens's settings.
        baseline_token (int): The token of Captum's baseline input.
        learned (LayerIGLens, optional): The lens under a learned readout per
                    layer, for the fitted-lens methods. Default: None

    Returns:
        2-element tuple of the :class:`Work` and the lens trajectory
        ``f(h_0), f(h_{L_1}), ..., p`` ``(B, k + 1)``.
    """
    extra = (mask,)
    position = [ids.shape[1] - 1]
    found = ig_lens.attribute_map(
        ids, additional_forward_args=extra, positions=position, **settings.map_kwargs()
    )
    from_h0 = (
        found
        if settings.baselines is None
        else ig_lens.attribute_map(ids, None, found.targets, extra, positions=position)
    )
    levels = torch.cat([from_h0.base_prob[..., None], from_h0.levels], -1)
    work = Work.from_map(
        parts,
        ig_lens,
        ids,
        mask,
        found,
        from_h0.base_prob,
        settings,
        baseline_token,
        learned,
    )
    work.outcomes.update(
        ig_lens=ig_lens_outcome(found, settings),
        logit_lens=logit_lens_outcome(levels, from_h0.layer_names),
        logit_lens_diff=logit_lens_diff_outcome(levels, from_h0.layer_names),
    )
    return work, levels[:, 0]


def method_scores(work: Work, name: str) -> np.ndarray:
    r"""
    Method ``name``'s ``(B, k)`` scores of ``work``'s one position (run once per
    work: see :func:`~captum_iglens.studies.methods.registry.outcome`).

    Args:

        work (Work): From :func:`study_work`.
        name (str): A scored method with a runner.

    Returns:
        *ndarray* ``(B, k)``.
    """
    return outcome(work, name).scores[:, 0].cpu().numpy()


def subset_scores(
    work: Work, name: str, rows: Tensor, n_steps: int
) -> Tuple[Tensor, Tensor]:
    r"""
    A costly method's scores of the sequences ``rows`` of ``work`` only, with
    ``n_steps`` steps, and its largest ``|convergence delta|`` per sequence.

    Args:

        work (Work): From :func:`study_work`.
        name (str): A scored method marked ``costly`` (Layer Conductance).
        rows (Tensor): ``(b,)`` indices of sequences of ``work``.
        n_steps (int): Its integration steps.

    Returns:
        2-element tuple of the scores ``(b, k)`` and the deltas ``(b,)``.
    """
    picked = Work(
        work.parts,
        work.ig_lens,
        work.input_ids[rows],
        None if work.attention_mask is None else work.attention_mask[rows],
        targets=work.targets[rows.to(work.targets.device)],
        positions=work.positions,
        model_prob=work.model_prob[rows.to(work.model_prob.device)],
        h0_prob=work.h0_prob[rows.to(work.h0_prob.device)],
        settings=work.settings.replace(n_steps=n_steps),
        baseline_token=work.baseline_token,
    )
    found = METHODS[name].run(picked)  # type: ignore[misc]
    delta = found.delta[:, 0].abs().amax(-1)  # type: ignore[index]
    return found.scores[:, 0].float().cpu(), delta.float().cpu()
