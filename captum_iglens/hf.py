r"""
IG-Lens on text with a Hugging Face causal LM: prompt encoding, greedy generation and
attribution of the generated (or a given) answer, kept as separate steps.
"""

from typing import Any, List, Literal, Optional, Sequence, Tuple, Union

import captum
import torch
import transformers
from torch import Tensor
from tqdm import tqdm
from transformers.generation.streamers import BaseStreamer

import captum_iglens
from captum_iglens.layer_ig_lens import BaselineType, Granularity, LayerIGLens
from captum_iglens.result import IGLensResult

Positions = Literal["answer", "prompt", "all"]

# End-of-turn markers of common chat templates; generation stops at any that exist.
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>")


def encode_prompt(tokenizer: Any, prompt: str, *, chat: bool = True) -> Tensor:
    r"""
    Token ids of a prompt, with the tokenizer's chat template when it has one.

    Args:

        tokenizer (PreTrainedTokenizerBase): The model's tokenizer.
        prompt (str): The user's text; must not be empty.
        chat (bool, optional): Apply the chat template (a user turn followed by
                    the assistant's header) when the tokenizer has one.
                    Default: True.

    Returns:
        *Tensor* of shape ``(1, T)``: the prompt's token ids.
    """
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("prompt: expected a non-empty string")
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}],
            tokenize=False,
            add_generation_prompt=True,
        )
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    else:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
    return ids


def stop_token_ids(tokenizer: Any) -> List[int]:
    """The end-of-sequence and end-of-turn token ids the tokenizer knows."""
    vocab = tokenizer.get_vocab()
    ids = {vocab[token] for token in _END_OF_TURN if token in vocab}
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


class _Progress(BaseStreamer):
    """Advances a progress bar once per generated token."""

    def __init__(self, bar: tqdm) -> None:
        self.bar = bar
        self.prompt_seen = False

    def put(self, value: Tensor) -> None:
        if self.prompt_seen:
            self.bar.update(1)
        self.prompt_seen = True

    def end(self) -> None:
        self.bar.close()


def generate_answer(
    model: Any,
    tokenizer: Any,
    input_ids: Tensor,
    *,
    max_new_tokens: int = 32,
    progress: bool = False,
) -> Tensor:
    r"""
    Greedy continuation of a prompt, stopping at an end-of-sequence or end-of-turn
    token (which is not included).

    Args:

        model (PreTrainedModel): The causal LM.
        tokenizer (PreTrainedTokenizerBase): Its tokenizer.
        input_ids (Tensor): ``(1, T)`` prompt ids.
        max_new_tokens (int, optional): The most tokens to generate. Default: 32.
        progress (bool, optional): Show a progress bar on stderr. Default: False.

    Returns:
        *Tensor* of shape ``(n,)``: the generated token ids, ``n <= max_new_tokens``.
    """
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(
            f"max_new_tokens: expected an int >= 1, got {max_new_tokens!r}"
        )
    stops = stop_token_ids(tokenizer)
    device = next(model.parameters()).device
    bar = tqdm(
        total=max_new_tokens, desc="generating", unit="tok", disable=not progress
    )
    with torch.inference_mode():
        out = model.generate(
            input_ids.to(device),
            attention_mask=torch.ones_like(input_ids, device=device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=stops or None,
            pad_token_id=(
                tokenizer.pad_token_id
                if tokenizer.pad_token_id is not None
                else (stops[0] if stops else 0)
            ),
            streamer=_Progress(bar),
        )
    answer = out[0, input_ids.shape[1] :].cpu()
    ends = torch.isin(answer, torch.tensor(stops, dtype=answer.dtype)).nonzero()
    return answer[: int(ends[0, 0])] if len(ends) else answer


def left_pad(sequences: Sequence[Tensor], pad_id: int) -> Tuple[Tensor, Tensor]:
    r"""
    Stack 1-D token-id tensors into a left-padded batch.

    Returns:
        2-element tuple of **ids** ``(B, T)`` and **attention_mask** ``(B, T)``.
    """
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    mask = torch.zeros(len(sequences), length, dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, length - len(seq) :] = seq
        mask[row, length - len(seq) :] = 1
    return ids, mask


def teacher_forcing(
    prompt_ids: Tensor, answer_ids: Tensor, positions: Positions = "answer"
) -> Tuple[Tensor, Tensor, Tensor]:
    r"""
    The sequence ``prompt + answer`` and, for the chosen tokens, the positions that
    predict them and their ids.

    Args:

        prompt_ids (Tensor): ``(1, T_p)`` prompt ids.
        answer_ids (Tensor): ``(n,)`` answer ids.
        positions (str, optional): ``"answer"``, ``"prompt"`` or ``"all"``.
                    Default: ``"answer"``.

    Returns:
        3-element tuple of **ids** ``(1, T)``, **positions** ``(P,)`` and
        **targets** ``(1, P)``, where ``targets[0, i] = ids[0, positions[i] + 1]``.
    """
    prompt_length = prompt_ids.shape[1]
    ids = torch.cat([prompt_ids[0], answer_ids.to(prompt_ids)])[None]
    spans = {
        "answer": (prompt_length - 1, ids.shape[1] - 1),
        "prompt": (0, prompt_length - 1),
        "all": (0, ids.shape[1] - 1),
    }
    if positions not in spans:
        raise ValueError(
            f"positions: expected 'answer', 'prompt' or 'all', got {positions!r}"
        )
    pos = torch.arange(*spans[positions])
    if pos.numel() == 0:
        raise ValueError(
            f"positions: nothing to attribute for positions={positions!r} (the "
            f"{'answer is empty' if positions == 'answer' else 'prompt has one token'})"
        )
    return ids, pos, ids[:, pos + 1]


def attribute_text(
    model: Any,
    tokenizer: Any,
    prompt: str,
    *,
    answer: Optional[Union[str, Tensor]] = None,
    chat: bool = True,
    max_new_tokens: int = 32,
    layers: Optional[Sequence[int]] = None,
    positions: Positions = "answer",
    baselines: BaselineType = None,
    method: str = "prediction_aware",
    n_steps: int = 50,
    granularity: Granularity = "block",
    lens: Optional[LayerIGLens] = None,
    progress: bool = False,
) -> IGLensResult:
    r"""
    The IG-Lens map of a model's answer to a prompt, with token strings attached.

    The prompt is encoded (with the chat template by default) and the answer is
    generated greedily unless given. Every attributed position ``t`` is credited
    for the token that actually follows it in ``prompt + answer`` (teacher
    forcing), which for a greedy answer is also the model's own prediction.

    Args:

        model (PreTrainedModel): A causal LM of a supported architecture.
        tokenizer (PreTrainedTokenizerBase): Its tokenizer.
        prompt (str): The user's text.
        answer (str or Tensor, optional): A precomputed answer to attribute
                    instead of generating one: text, or token ids ``(n,)`` (ids
                    avoid re-tokenising a generated answer). Default: None
        chat (bool, optional): Apply the chat template. Default: True.
        max_new_tokens (int, optional): Generation length limit. Default: 32.
        layers (list[int], optional): Block indices on the path; the last block
                    is always included. Default: all blocks.
        positions (str, optional): ``"answer"``, ``"prompt"`` or ``"all"``: the
                    tokens whose probabilities are attributed. Default: ``"answer"``.
        baselines, method, n_steps, granularity: As in
                    :meth:`LayerIGLens.attribute_map`.
        lens (LayerIGLens, optional): The lens to use, e.g. one built by hand for
                    a model outside the architecture table; its
                    ``forward_func`` must take ``(input_ids)``. Default:
                    ``LayerIGLens.from_model(model, layers)``.
        progress (bool, optional): Progress bar for generation. Default: False.

    Returns:
        :class:`~captum_iglens.IGLensResult` for one sequence (``B = 1``), with
        ``tokens`` (the attributed tokens as text) and ``metadata`` (prompt,
        answer, settings, package versions).
    """
    prompt_ids = encode_prompt(tokenizer, prompt, chat=chat)
    if answer is None:
        answer_ids = generate_answer(
            model,
            tokenizer,
            prompt_ids,
            max_new_tokens=max_new_tokens,
            progress=progress,
        )
    elif isinstance(answer, str):
        answer_ids = tokenizer(
            answer, add_special_tokens=False, return_tensors="pt"
        ).input_ids[0]
    else:
        answer_ids = answer
    ids, pos, targets = teacher_forcing(prompt_ids, answer_ids, positions)
    if lens is None:
        lens = LayerIGLens.from_model(model, layers)
    elif layers is not None:
        raise ValueError("layers: pass either layers or lens, not both")
    device = next(model.parameters()).device
    result = lens.attribute_map(
        ids.to(device),
        baselines=baselines,
        target=targets.to(device),
        positions=pos,
        method=method,
        n_steps=n_steps,
        granularity=granularity,
    )
    result.tokens = [[tokenizer.decode([i]) for i in targets[0].tolist()]]
    result.metadata = {
        "prompt": prompt,
        "answer": tokenizer.decode(answer_ids),
        "chat": chat,
        "positions": positions,
        "granularity": granularity,
        "baselines": baselines if isinstance(baselines, (str, int, float)) else None,
        "model": getattr(model.config, "_name_or_path", "") or type(model).__name__,
        "versions": {
            "captum_iglens": captum_iglens.__version__,
            "captum": captum.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
    }
    return result.to("cpu")
