r"""
Per-layer scores of the first answer token for the validation study: IG-Lens, the
logit lens and its differences from one IG-Lens pass, DLA and Layer Conductance
from the comparison's runners.
"""

from typing import Dict, List, Tuple

import numpy as np
import torch
from torch import Tensor

from captum_iglens.attr.layer_ig_lens import LayerIGLens
from captum_iglens.hf.parts import ModelParts
from captum_iglens.settings import Settings
from captum_iglens.studies.comparison.runners import (
    Work,
    default_baseline_token,
    dla,
    layer_conductance,
)

#: Methods compared with the ablation, in the order of the table.
SCORED_METHODS: Tuple[str, ...] = (
    "ig_lens",
    "ig_lens_abs",
    "logit_lens",
    "logit_lens_diff",
    "dla",
    "layer_conductance",
    "random",
)


def lens_scores(
    parts: ModelParts,
    lens: LayerIGLens,
    ids: Tensor,
    mask: Tensor,
    settings: Settings,
    methods: List[str],
) -> Tuple[Dict[str, np.ndarray], np.ndarray, Work]:
    r"""
    The ``(B, k)`` scores of the model's greedy next token at the last position:
    IG-Lens (signed and absolute), the logit-lens levels and their differences,
    and DLA when asked for; the lens trajectory ``f(h_0), f(h_{L_1}), ..., p``
    ``(B, k + 1)``; and the :class:`Work` that further methods can run on.

    One IG-Lens pass gives IG-Lens and the logit lens; a second one, from
    ``h_0``, only when the settings choose another baseline.
    """
    extra = (mask,)
    position = [ids.shape[1] - 1]
    found = lens.attribute_map(
        ids, additional_forward_args=extra, positions=position, **settings.map_kwargs()
    )
    from_h0 = (
        found
        if settings.baselines is None
        else lens.attribute_map(ids, None, found.targets, extra, positions=position)
    )
    trajectory = torch.cat([from_h0.base_prob[..., None], from_h0.lens], -1)[:, 0]
    scores = {
        "ig_lens": found.attributions[:, 0].cpu().numpy(),
        "logit_lens": from_h0.lens[:, 0].cpu().numpy(),
        "logit_lens_diff": trajectory.diff(dim=-1).cpu().numpy(),
    }
    scores["ig_lens_abs"] = np.abs(scores["ig_lens"])
    work = Work.from_map(
        parts,
        lens,
        ids,
        mask,
        found,
        from_h0.base_prob,
        settings,
        default_baseline_token(parts.model),
    )
    if "dla" in methods:
        scores["dla"] = dla(work).scores[:, 0].float().cpu().numpy()
    return scores, trajectory.cpu().numpy(), work


def conductance_scores(work: Work, rows: Tensor, n_steps: int) -> Tuple[Tensor, Tensor]:
    r"""
    Layer Conductance ``(b, k)`` of the sequences ``rows`` of ``work``, with
    ``n_steps`` steps, and its largest ``|convergence delta|`` per sequence
    ``(b,)``.
    """
    picked = Work(
        work.parts,
        work.lens,
        work.input_ids[rows],
        None if work.attention_mask is None else work.attention_mask[rows],
        targets=work.targets[rows.to(work.targets.device)],
        positions=work.positions,
        model_prob=work.model_prob[rows.to(work.model_prob.device)],
        h0_prob=work.h0_prob[rows.to(work.h0_prob.device)],
        settings=work.settings.replace(n_steps=n_steps),
        baseline_token=work.baseline_token,
    )
    outcome = layer_conductance(picked)
    delta = outcome.delta[:, 0].abs().amax(-1)  # type: ignore[index]
    return outcome.scores[:, 0].float().cpu(), delta.float().cpu()
