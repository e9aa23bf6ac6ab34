r"""
One padded batch of a prompt set, attributed in one pass.

Each prompt's answer (generated greedily unless given) is attributed by teacher
forcing, as :func:`captum_iglens.attribute_text` does. Prompts are attributed
in left-padded batches: with left padding every sequence ends in the last column,
so the positions that predict each prompt's answer are a suffix of the columns,
and one shared set of positions, the longest answer's, covers every prompt of the
batch. Each prompt keeps its own answer rows; the rows of a shorter answer's
extra positions (prompt or padding) are computed and dropped.
"""

from dataclasses import replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from captum_iglens._utils.tokens import decode_tokens
from captum_iglens.attr.layer_ig_lens import LayerIGLens
from captum_iglens.hf.text import (
    decoded_top_tokens,
    encode_answer,
    encode_prompt,
    generate,
    left_pad,
    pad_token_id,
    positions_span,
)
from captum_iglens.result import IGLensResult
from captum_iglens.settings import Settings
from captum_iglens.studies.batch.records import GIVEN


def attribute_batch(
    model: Any,
    tokenizer: Any,
    ig_lens: LayerIGLens,
    batch: Sequence[Dict[str, Any]],
    settings: Settings,
) -> List[Dict[str, Any]]:
    """One record per prompt of ``batch``, in order; one padded attribution pass."""
    prompt_ids = [
        encode_prompt(tokenizer, item["prompt"], chat=settings.chat)[0]
        for item in batch
    ]
    answers: List[Optional[Tensor]] = [
        encode_answer(tokenizer, item["answer"]) if "answer" in item else None
        for item in batch
    ]
    missing = [i for i, a in enumerate(answers) if a is None]
    if missing:
        generated = generate(
            model,
            tokenizer,
            [prompt_ids[i] for i in missing],
            max_new_tokens=settings.max_new_tokens,
        )
        for i, answer in zip(missing, generated):
            answers[i] = answer
    given = [a for a in answers if a is not None]
    assert len(given) == len(answers)  # each given or generated above
    sequences = [torch.cat([p, a.to(p)]) for p, a in zip(prompt_ids, given)]
    spans = [
        positions_span(len(p), len(s), settings.positions)
        for p, s in zip(prompt_ids, sequences)
    ]
    results = _attribute_padded(
        ig_lens, sequences, spans, pad_token_id(tokenizer), settings
    )
    records = []
    for item, answer, result in zip(batch, given, results):
        result.tokens = [decode_tokens(tokenizer, result.targets[0].tolist())]
        if result.top_ids is not None:
            result.top_tokens = decoded_top_tokens(tokenizer, result.top_ids)
        result.metadata = {
            "chat": settings.chat,
            "positions": settings.positions,
            GIVEN: item.get("answer"),
        }
        records.append(
            {
                "id": item["id"],
                "prompt": item["prompt"],
                "answer": tokenizer.decode(answer),
                **result.to_dict(),
            }
        )
    return records


def _attribute_padded(
    ig_lens: LayerIGLens,
    sequences: List[Tensor],
    spans: List[Tuple[int, int]],
    pad_id: int,
    settings: Settings,
) -> List[IGLensResult]:
    """
    Each sequence's map of its positions ``[start, end)``, from one padded pass.

    With left padding, sequence ``i`` starts at column ``offset_i``; the pass
    attributes the union of every sequence's columns, and each sequence keeps
    its own. A sequence with nothing to attribute gets an empty map.
    """
    ids, mask = left_pad(sequences, pad_id)
    width = ids.shape[1]
    offsets = [width - len(s) for s in sequences]
    columns = [(o + a, o + b) for o, (a, b) in zip(offsets, spans)]
    filled = [(a, b) for a, b in columns if b > a]
    if not filled:
        names = ig_lens.segment_names(settings.granularity)
        empty = IGLensResult.empty(
            names, settings.estimator, settings.steps, settings.path
        )
        return [empty] * len(sequences)
    first, last = min(a for a, _ in filled), max(b for _, b in filled)
    positions = torch.arange(first, last)
    device = ig_lens.readout.device
    found = ig_lens.attribute_map(
        ids.to(device),
        target=ids[:, positions + 1].to(device),
        additional_forward_args=(mask.to(device),),
        positions=positions,
        **settings.map_kwargs(),
    ).to("cpu")
    results = []
    for row, ((a, b), offset) in enumerate(zip(columns, offsets)):
        keep = torch.arange(a - first, b - first) if b > a else torch.arange(0)
        result = found.select(batch=[row], positions=keep)
        results.append(replace(result, positions=result.positions - offset))
    return results
