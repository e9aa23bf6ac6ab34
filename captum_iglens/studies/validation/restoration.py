r"""
Causal tracing at the attributed position (restoration, in the style of Meng et
al. 2022): corrupt the prompt, then restore the clean residual state ``h_L`` of one
block at the attributed position only and run the rest of the model.

- the noise: :mod:`captum_iglens.attr.subject_noise` (shared with the
  probability flow's ``corrupt_subject``).
- :func:`restore`: the clean, corrupted and restored probabilities of each target,
  for every chosen block, with the corrupted and restored forwards stacked along
  the batch.
"""

import copy
from dataclasses import dataclass
from typing import (
    Any,
    Callable,
    Dict,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
    cast,
)

import torch
from torch import Tensor
from torch.nn import Module

from captum_iglens.attr._utils.capture import hidden_of
from captum_iglens.attr.subject_noise import noise_draw
from captum_iglens.hf.architectures import model_parts
from captum_iglens.hf.forward import position_ids_from_mask
from captum_iglens.hf.parts import ModelParts
from captum_iglens.studies.validation.hooks import (
    hooked,
    replace_output,
    target_probabilities,
)

#: The corruptions of the restoration study.
CORRUPTIONS: Tuple[str, ...] = ("noise", "counterfactual")


@dataclass
class Restoration:
    r"""
    The model's probability of each target, clean, corrupted, and corrupted with
    the clean ``h_L`` of one block restored at the attributed position (averaged
    over the noise seeds).

    Attributes:

        clean (Tensor): ``(B,)`` float32.
        corrupt (Tensor): ``(B,)`` float32.
        restored (Tensor): ``(B, k)`` float32, with block ``L_j``'s output restored.
    """

    clean: Tensor
    corrupt: Tensor
    restored: Tensor

    @property
    def recovery(self) -> Tensor:
        r"""``(B, k)``: ``(p_restored − p_corrupt) / (p_clean − p_corrupt)``; 1 where
        the clean probability is recovered, 0 where restoring does nothing (NaN or
        infinite where the corruption leaves ``p`` unchanged)."""
        gap = (self.clean - self.corrupt)[:, None]
        return (self.restored - self.corrupt[:, None]) / gap


def restore(
    model: Union[Module, ModelParts],
    input_ids: Tensor,
    attention_mask: Optional[Tensor] = None,
    *,
    targets: Tensor,
    subject_mask: Optional[Tensor] = None,
    noise_std: Optional[float] = None,
    seeds: Sequence[int] = (0, 1, 2),
    corrupted_ids: Optional[Tensor] = None,
    layers: Optional[Sequence[int]] = None,
    max_batch: int = 256,
) -> Restoration:
    r"""
    Restoration at the last position: the probability of each target when the
    prompt is corrupted, and when, in the corrupted forward, the output of block
    ``L`` at the last position is replaced by its clean value, for every chosen
    block ``L``.

    Two corruptions, exactly one of which is given:

    - noise (``subject_mask`` and ``noise_std``): Gaussian noise of standard
      deviation ``noise_std`` is added to the embeddings of the masked tokens, one
      draw per seed (the same draw for the corrupted and all restored forwards of
      that seed); probabilities are averaged over the seeds. Each sequence's draw
      is ``torch.randn(n, d)`` over its ``n`` real tokens from a generator seeded
      with the seed, whatever the batch and its padding.
    - ``corrupted_ids``: the prompt is replaced by other tokens of the same
      length (e.g. a counterfactual subject).

    The corrupted and restored copies of the batch are stacked along the batch
    dimension, up to ``max_batch`` sequences per forward. Hooks on the embedding
    and the chosen blocks are registered for the call and removed when it ends.

    Args:

        model (PreTrainedModel or ModelParts): A causal LM of a supported
                    architecture, or its :func:`~captum_iglens.hf.model_parts`.
        input_ids (Tensor): ``(B, T)`` token ids of the clean prompts, left-padded.
        attention_mask (Tensor, optional): ``(B, T)``, zeros at left padding.
                    Default: None
        targets (Tensor): ``(B,)`` token ids, the predicted tokens at the last
                    position.
        subject_mask (Tensor, optional): ``(B, T)`` bool: the tokens to noise.
        noise_std (float, optional): The noise's standard deviation, e.g. three
                    times
                    :func:`~captum_iglens.attr.subject_noise.embedding_std`.
        seeds (list[int], optional): One noise draw per seed. Default: (0, 1, 2).
        corrupted_ids (Tensor, optional): ``(B, T)`` token ids of the corrupted
                    prompts, with the same mask.
        layers (list[int], optional): Block indices; the last block is always
                    added. Default: all blocks.
        max_batch (int, optional): The most sequences in one forward.
                    Default: 256.

    Returns:
        :class:`Restoration`.
    """
    noise = _check_corruption(input_ids, subject_mask, noise_std, seeds, corrupted_ids)
    parts = model_parts(model)
    model, blocks, chosen = parts.model, parts.blocks, parts.choose(layers)
    device = next(model.parameters()).device
    ids = input_ids.to(device)
    batch, length = ids.shape
    mask = torch.ones_like(ids) if attention_mask is None else attention_mask.to(device)
    targets = torch.as_tensor(targets, device=device).reshape(batch, 1)
    last = torch.tensor([length - 1], device=device)
    embed = cast(Any, model).get_input_embeddings()
    draws: List[Optional[Tensor]] = [None]
    if noise:
        # _check_corruption refused noise without a subject mask and a std.
        assert subject_mask is not None and noise_std is not None
        width = embed.weight.shape[1]
        draws = [
            noise_draw(mask, subject_mask, seed, width, noise_std).to(device)
            for seed in seeds
        ]
    corrupt_ids = ids if corrupted_ids is None else corrupted_ids.to(device)
    tracer = _Tracer(batch, len(chosen))
    with torch.inference_mode():
        with hooked({blocks[i]: tracer.recorder(j) for j, i in enumerate(chosen)}):
            clean = target_probabilities(model, ids, mask, last, targets)[:, 0]
        hooks = {blocks[i]: tracer.restorer(j) for j, i in enumerate(chosen)}
        hooks[embed] = tracer.noiser
        with hooked(hooks):
            out = [
                tracer.trace(model, corrupt_ids, mask, targets, draw, max_batch)
                for draw in draws
            ]
    stacked = torch.stack(out).mean(0)
    return Restoration(
        clean=clean.cpu(), corrupt=stacked[0].cpu(), restored=stacked[1:].T.cpu()
    )


def _check_corruption(
    input_ids: Tensor,
    subject_mask: Optional[Tensor],
    noise_std: Optional[float],
    seeds: Sequence[int],
    corrupted_ids: Optional[Tensor],
) -> bool:
    """Whether the corruption is noise (else counterfactual ids), once the
    arguments are checked."""
    noise = subject_mask is not None or noise_std is not None
    if noise == (corrupted_ids is not None):
        raise ValueError(
            "corruption: expected either subject_mask and noise_std (noise) or "
            "corrupted_ids (counterfactual)"
        )
    if noise and (subject_mask is None or noise_std is None or noise_std <= 0):
        raise ValueError("subject_mask, noise_std: noise needs both, noise_std > 0")
    if noise and not seeds:
        raise ValueError("seeds: expected at least one seed")
    shape = tuple(input_ids.shape)
    if corrupted_ids is not None and tuple(corrupted_ids.shape) != shape:
        raise ValueError(
            f"corrupted_ids: expected shape {shape}, got {tuple(corrupted_ids.shape)}"
        )
    if noise and subject_mask[:, -1].any():  # type: ignore[index]
        raise ValueError(
            "subject_mask: the last position is the one restored; it must not be noised"
        )
    return noise


class _Tracer:
    r"""
    The hooks of one :func:`restore` call on a batch of ``batch`` sequences and
    ``k`` chosen blocks: the clean last-position states of the chosen blocks,
    recorded from the clean forward; the noise draw added to the embeddings
    (prefix forwards); and, per copy of the batch in the forward in flight, the
    block restored (None: the corrupted forward).
    """

    def __init__(self, batch: int, k: int) -> None:
        self.batch, self.k = batch, k
        self.clean_states: Dict[int, Tensor] = {}
        self.draw: Optional[Tensor] = None
        self.restored: List[Optional[int]] = []

    def recorder(self, j: int) -> Callable[..., None]:
        def hook(module: Module, args: Any, kwargs: Any, output: Any) -> None:
            self.clean_states[j] = hidden_of(output)[:, -1].clone()

        return hook

    def noiser(self, module: Module, args: Any, kwargs: Any, output: Any) -> Any:
        if self.draw is None:
            return None
        return output + self.draw[:, : output.shape[1]].to(output.dtype)

    def restorer(self, j: int) -> Callable[..., Any]:
        def hook(module: Module, args: Any, kwargs: Any, output: Any) -> Any:
            replicas = [r for r, block in enumerate(self.restored) if block == j]
            if not replicas:
                return None
            edited = hidden_of(output).clone()
            for replica in replicas:
                rows = slice(replica * self.batch, (replica + 1) * self.batch)
                edited[rows, -1] = self.clean_states[j].to(edited.dtype)
            return replace_output(output, edited)

        return hook

    def trace(
        self,
        model: Module,
        ids: Tensor,
        mask: Tensor,
        targets: Tensor,
        draw: Optional[Tensor],
        max_batch: int,
    ) -> Tensor:
        r"""
        ``(k + 1, B)``: the probabilities of the corrupted forward and of each
        block restored, for one noise draw. Restoring at the last position leaves
        every earlier position as in the corrupted forward: the prefix runs once,
        and each corrupted or restored copy runs the last token only, on a copy
        of the prefix's cache, up to ``max_batch`` sequences per forward.
        """
        batch = self.batch
        position_ids = position_ids_from_mask(mask)
        self.draw, self.restored = draw, []
        prefix = model(
            input_ids=ids[:, :-1],
            attention_mask=mask[:, :-1],
            position_ids=position_ids[:, :-1],
            use_cache=True,
        ).cache
        self.draw = None
        variants: List[Optional[int]] = [None, *range(self.k)]
        per_chunk = max(1, max_batch // batch)
        out = []
        for start in range(0, len(variants), per_chunk):
            self.restored = variants[start : start + per_chunk]
            copies = len(self.restored)
            cache = copy.deepcopy(prefix)
            cache.reorder_cache(torch.arange(batch, device=ids.device).repeat(copies))
            logits = model(
                input_ids=ids[:, -1:].repeat(copies, 1),
                attention_mask=mask.repeat(copies, 1),
                position_ids=position_ids[:, -1:].repeat(copies, 1),
                cache=cache,
                use_cache=True,
            ).logits[:, -1]
            probs = logits.float().softmax(-1)
            chosen_probs = probs.gather(-1, targets.repeat(copies, 1))[:, 0]
            out.append(chosen_probs.view(copies, batch))
        return torch.cat(out)
