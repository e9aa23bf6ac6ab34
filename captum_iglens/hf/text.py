r"""
Text in and out of a Hugging Face causal LM, written once for every entry point:
prompt encoding (with or without the chat template), one pad and stop policy, left
padding, batched greedy generation and teacher forcing.
"""

import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor
from tqdm import tqdm
from transformers.generation.streamers import BaseStreamer

from captum_iglens._utils.tokens import decode_tokens
from captum_iglens.hf.positions import POSITIONS, Positions


# End-of-turn markers of common chat templates; generation stops at any that exist.
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>")


def encode_prompt(tokenizer: Any, prompt: str, *, chat: bool = True) -> Tensor:
    r"""
    Token ids of a prompt, with the tokenizer's chat template when it has one.

    Args:

        tokenizer (PreTrainedTokenizerBase): The model's tokenizer.
        prompt (str): The user's text; must not be empty.
        chat (bool, optional): Apply the chat template (a user turn followed by
                    the assistant's header) when the tokenizer has one; a
                    tokenizer without one gets the raw prompt, with a warning
                    (shown once). Default: True.

    A prompt that spells one of the tokenizer's control tokens (e.g.
    ``<|im_end|>``) is encoded with that token, as a chat template's own
    markers are; a warning (shown once) says so.

    Returns:
        *Tensor* of shape ``(1, T)``: the prompt's token ids.
    """
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("prompt: expected a non-empty string")
    spelled = [t for t in getattr(tokenizer, "all_special_tokens", ()) if t in prompt]
    if spelled:
        # stacklevel 1: one location, so Python's default filter shows it once.
        warnings.warn(
            f"the prompt spells the control token(s) {', '.join(spelled)}; they "
            "are read as control tokens, not as text",
            stacklevel=1,
        )
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}],
            tokenize=False,
            add_generation_prompt=True,
        )
        return tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    if chat:
        warnings.warn(
            "the tokenizer has no chat template; the raw prompt is used",
            stacklevel=1,
        )
    return tokenizer(prompt, return_tensors="pt").input_ids


def encode_answer(tokenizer: Any, answer: str) -> Tensor:
    r"""
    Token ids ``(n,)`` of an answer that continues a prompt (no special tokens).
    """
    if not isinstance(answer, str):
        raise TypeError(f"answer: expected a string, got {type(answer).__name__}")
    ids = tokenizer.encode(answer, add_special_tokens=False)
    return torch.tensor(ids, dtype=torch.long).reshape(-1)


def decoded_top_tokens(tokenizer: Any, top_ids: Tensor) -> List[Any]:
    r"""``top_ids`` ``(B, P, k, K)`` as nested lists of token strings, each id
    decoded once as the targets are: a token holding part of a UTF-8 character
    shows its bytes, not U+FFFD (see ``decode_tokens``)."""
    cache: Dict[int, str] = {}

    def text(i: int) -> str:
        if i not in cache:
            (cache[i],) = decode_tokens(tokenizer, [i])
        return cache[i]

    return [
        [[[text(i) for i in layer] for layer in pos] for pos in seq]
        for seq in top_ids.tolist()
    ]


def stop_token_ids(tokenizer: Any) -> List[int]:
    """The end-of-sequence and end-of-turn token ids the tokenizer knows (a
    tokenizer without ``get_vocab``, as Captum's ``TokenizerLike`` allows, has
    only its ``eos_token_id``)."""
    get_vocab = getattr(tokenizer, "get_vocab", None)
    vocab = get_vocab() if callable(get_vocab) else {}
    ids = {vocab[token] for token in _END_OF_TURN if token in vocab}
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None:
        ids.add(eos)
    return sorted(ids)


def pad_token_id(tokenizer: Any) -> int:
    r"""
    The id used for padding: the tokenizer's pad token, else its end-of-sequence
    token, else its first stop token, else 0. Padding is always masked, so the
    choice never changes a result.
    """
    for name in ("pad_token_id", "eos_token_id"):
        candidate = getattr(tokenizer, name, None)
        if candidate is not None:
            return int(candidate)
    stops = stop_token_ids(tokenizer)
    return stops[0] if stops else 0


def left_pad(sequences: Sequence[Tensor], pad_id: int) -> Tuple[Tensor, Tensor]:
    r"""
    Stack 1-D token-id tensors into a left-padded batch.

    Returns:
        2-element tuple of **ids** ``(B, T)`` and **attention_mask** ``(B, T)``.
    """
    if not sequences:
        raise ValueError("sequences: expected at least one sequence")
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    mask = torch.zeros(len(sequences), length, dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, length - len(seq) :] = seq
        mask[row, length - len(seq) :] = 1
    return ids, mask


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


def _within_context(model: Any, prompt_length: int, max_new_tokens: int) -> int:
    """``max_new_tokens``, capped (with a warning) so that prompt and answer fit
    in the model's context length when its config states one."""
    config = getattr(model, "config", None)
    context = next(
        (
            getattr(config, name)
            for name in ("max_position_embeddings", "n_positions", "n_ctx")
            if isinstance(getattr(config, name, None), int)
        ),
        None,
    )
    if context is None or prompt_length + max_new_tokens <= context:
        return max_new_tokens
    room = context - prompt_length
    if room < 1:
        raise ValueError(
            f"prompt: {prompt_length} tokens leave no room for an answer in the "
            f"model's context of {context} tokens"
        )
    warnings.warn(
        f"max_new_tokens: capped at {room}, the model's context length ({context}) "
        f"minus the prompt ({prompt_length} tokens)",
        stacklevel=3,
    )
    return room


def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Tensor],
    *,
    max_new_tokens: int = 32,
    progress: bool = False,
    gen_args: Optional[Dict[str, Any]] = None,
) -> List[Tensor]:
    r"""
    Greedy continuations of a batch of prompts, generated together (left padded),
    each cut at its first end-of-sequence or end-of-turn token (not included).

    Args:

        model (PreTrainedModel): The causal LM.
        tokenizer (PreTrainedTokenizerBase): Its tokenizer.
        prompts (list[Tensor]): 1-D prompt ids, one per prompt.
        max_new_tokens (int, optional): The most tokens to generate; capped, with
                    a warning, at what the model's context length leaves after
                    the prompt. Default: 32.
        progress (bool, optional): A per-token progress bar on stderr (one prompt
                    only). Default: False.
        gen_args (dict, optional): Further arguments of ``model.generate``, over
                    the greedy defaults. Default: None.

    Returns:
        *list[Tensor]*: for each prompt, the generated ids ``(n,)``,
        ``n <= max_new_tokens``, on the CPU. Each is checked to be the greedy
        choice of the model's own teacher-forced logits (:func:`not_greedy`);
        where the cached generation is not, it is generated again without the
        KV cache.

    Raises:
        ValueError: If even that gives a token that is not the greedy choice.
    """
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, int)
        or max_new_tokens < 1
    ):
        raise ValueError(
            f"max_new_tokens: expected an int >= 1, got {max_new_tokens!r}"
        )
    stops = stop_token_ids(tokenizer)
    ids, mask = left_pad([p.reshape(-1) for p in prompts], pad_token_id(tokenizer))
    args: Dict[str, Any] = dict(
        max_new_tokens=_within_context(model, ids.shape[1], max_new_tokens),
        do_sample=False,
        eos_token_id=stops or None,
        pad_token_id=pad_token_id(tokenizer),
    )
    args.update(gen_args or {})
    if progress and len(prompts) == 1:  # streamers take one sequence
        bar = tqdm(total=args["max_new_tokens"], desc="generating", unit="tok")
        args["streamer"] = _Progress(bar)
    answers = _generated(model, ids, mask, stops, args)
    wrong = not_greedy(model, ids, mask, answers)
    if wrong is not None and args.get("use_cache", True):
        # A KV cache can be wrong where the model is right (a TransformerLens 4
        # bridge booted around it changes its cached generation): without it.
        args.pop("streamer", None)
        answers = _generated(model, ids, mask, stops, {**args, "use_cache": False})
        wrong = not_greedy(model, ids, mask, answers)
    if wrong is not None:
        row, i = wrong
        raise ValueError(
            f"generate: model.generate gave answer token {i} of prompt {row} that "
            "is not the greedy choice of the model's own logits, even without the "
            "KV cache; the attribution would explain a token the model does not "
            "say. Pass the answer explicitly (answer=...)"
        )
    return answers


def _generated(
    model: Any, ids: Tensor, mask: Tensor, stops: List[int], args: Dict[str, Any]
) -> List[Tensor]:
    """``model.generate`` of the left-padded ``ids``, each continuation cut at
    its first stop token, on the CPU."""
    device = next(model.parameters()).device
    with torch.inference_mode():
        out = model.generate(ids.to(device), attention_mask=mask.to(device), **args)
    sequences = getattr(out, "sequences", out)
    if not isinstance(sequences, Tensor) or sequences.dim() != 2:
        raise ValueError(
            f"model.generate did not return token ids (B, T); got {type(out).__name__}"
        )
    answers = []
    stop = torch.tensor(stops, dtype=torch.long)
    for row in sequences[:, ids.shape[1] :].cpu():
        ends = torch.isin(row, stop).nonzero()
        answers.append(row[: int(ends[0, 0])] if len(ends) else row)
    return answers


def not_greedy(
    model: Any, ids: Tensor, mask: Tensor, answers: Sequence[Tensor]
) -> Optional[Tuple[int, int]]:
    r"""
    The first answer token that is not the greedy choice of the model's own
    teacher-forced logits (one forward without cache, a prompt at a time).

    Args:

        model (PreTrainedModel): The causal LM.
        ids (Tensor): ``(B, T)`` left-padded prompt ids; ``mask`` its mask.
        answers (list[Tensor]): The ``B`` answers ``(n_b,)``.

    Returns:
        *(prompt, token)* indices of the first such token, or None. A token
        within a rounding tolerance of the largest logit counts as greedy.
    """
    device = next(model.parameters()).device
    for row, answer in enumerate(answers):
        if len(answer) == 0:
            continue
        prompt = ids[row][mask[row].bool()]
        full = torch.cat([prompt, answer.to(prompt)])[None].to(device)
        with torch.inference_mode():
            logits = model(input_ids=full, use_cache=False).logits[0]
        rows = logits[len(prompt) - 1 : -1].float()
        best = rows.max(-1).values
        chosen = rows.gather(-1, answer.to(device)[:, None])[:, 0]
        wide = logits.dtype in (torch.float32, torch.float64)
        tol = (1e-3 if wide else 5e-2) * (1.0 + best.abs())
        below = (chosen < best - tol).nonzero()
        if len(below):
            return row, int(below[0, 0])
    return None


def answered_prompt(
    model: Any,
    tokenizer: Any,
    prompt: str,
    *,
    answer: Optional[Union[str, Tensor]] = None,
    chat: bool = True,
    max_new_tokens: int = 32,
    positions: Positions = "answer",
    progress: bool = False,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""
    A prompt and its answer (greedy unless given), ready for teacher forcing.

    Args:

        model (PreTrainedModel): The causal LM.
        tokenizer (PreTrainedTokenizerBase): Its tokenizer.
        prompt (str): The user's text.
        answer (str or Tensor, optional): The answer as text or ids ``(n,)``.
                    Default: None (generated).
        chat, max_new_tokens, positions, progress: As in :func:`encode_prompt`,
                    :func:`generate` and :func:`teacher_forcing`.

    Returns:
        4-element tuple of **ids** ``(1, T)``, **positions** ``(P,)``,
        **targets** ``(1, P)`` (see :func:`teacher_forcing`) and the answer's
        **answer_ids** ``(n,)``.
    """
    prompt_ids = encode_prompt(tokenizer, prompt, chat=chat)
    if answer is None:
        (answer_ids,) = generate(
            model,
            tokenizer,
            [prompt_ids],
            max_new_tokens=max_new_tokens,
            progress=progress,
        )
    elif isinstance(answer, str):
        answer_ids = encode_answer(tokenizer, answer)
    elif (
        isinstance(answer, Tensor) and not answer.is_floating_point()
    ) and answer.dim() == 1:
        answer_ids = answer
    else:
        raise TypeError(
            "answer: expected None, a string or token ids (n,) as an integer tensor, "
            f"got {type(answer).__name__}"
            + (f" of shape {tuple(answer.shape)}" if isinstance(answer, Tensor) else "")
        )
    warn_if_longer_than_trained(model, prompt_ids.numel() + len(answer_ids))
    return (*teacher_forcing(prompt_ids, answer_ids, positions), answer_ids)


def warn_if_longer_than_trained(model: Any, n_tokens: int) -> None:
    r"""
    Warns when a sequence is longer than the positions the model was made for
    (its config's ``max_position_embeddings``): its predictions there, and
    their credits, are an extrapolation.

    Args:

        model (PreTrainedModel): The model (a config without the field: no
                    warning).
        n_tokens (int): The sequence's length, prompt and answer.
    """
    config = getattr(model, "config", None)
    text = getattr(config, "get_text_config", lambda: config)()
    most = getattr(text, "max_position_embeddings", None)
    if isinstance(most, int) and n_tokens > most:
        warnings.warn(
            f"prompt: the prompt and answer are {n_tokens} tokens, more than the "
            f"{most} positions the model was made for (max_position_embeddings); "
            "beyond them its predictions, and their credits, are an extrapolation. "
            "Give a shorter prompt",
            stacklevel=3,
        )


def teacher_forcing(
    prompt_ids: Tensor, answer_ids: Tensor, positions: Positions = "answer"
) -> Tuple[Tensor, Tensor, Tensor]:
    r"""
    The sequence ``prompt + answer`` and, for the chosen tokens, the positions that
    predict them and their ids.

    Args:

        prompt_ids (Tensor): ``(1, T_p)`` or ``(T_p,)`` prompt ids.
        answer_ids (Tensor): ``(n,)`` answer ids.
        positions (str, optional): ``"answer"``, ``"prompt"`` or ``"all"``.
                    Default: ``"answer"``.

    Returns:
        3-element tuple of **ids** ``(1, T)``, **positions** ``(P,)`` and
        **targets** ``(1, P)``, where ``targets[0, i] = ids[0, positions[i] + 1]``.
        ``P`` is 0 when there is nothing to attribute (an empty answer).
    """
    prompt = prompt_ids.reshape(-1)
    ids = torch.cat([prompt, answer_ids.reshape(-1).to(prompt)])[None]
    start, end = positions_span(len(prompt), ids.shape[1], positions)
    pos = torch.arange(start, end)
    return ids, pos, ids[:, pos + 1]


def positions_span(
    prompt_length: int, length: int, positions: Positions
) -> Tuple[int, int]:
    r"""
    The attributed positions ``[start, end)`` of a sequence of ``length`` tokens
    whose first ``prompt_length`` are the prompt.
    """
    spans = {
        "answer": (prompt_length - 1, length - 1),
        "prompt": (0, prompt_length - 1),
        "all": (0, length - 1),
    }
    if positions not in spans:
        raise ValueError(
            f"positions: expected one of {list(POSITIONS)}, got {positions!r}"
        )
    return spans[positions]
