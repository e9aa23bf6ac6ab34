r"""
The text a lens is fitted on, which needs no download: by default sampled from
the model itself (seeded, so the same seed gives the same tokens on the same
machine and torch build), or read from a file (plain text, or JSON Lines of
``{"text": ...}`` objects or strings).

Both feed a :class:`~captum_iglens.lens_fit.states.StateRecorder`: sampled
sequences are recorded token by token while the model samples them; a file's
text is cut into windows that run through the blocks only.
"""

import json
from pathlib import Path
from typing import Any, List, Sequence

import torch
from torch import Tensor

from captum_iglens.hf.forward import position_ids_from_mask
from captum_iglens.hf.parts import ModelParts
from captum_iglens.hf.text import left_pad, pad_token_id
from captum_iglens.lens_fit.states import StateRecorder, record_forward


def read_corpus(path: Any) -> List[str]:
    r"""
    The texts of a corpus file, checked before any model loads.

    Args:

        path (str or Path): A ``.jsonl`` file (one JSON string, or object with a
                    string ``"text"``, per non-empty line) or a plain text file
                    (one text: the whole file).

    Returns:
        *list[str]*: the non-empty texts.

    Raises:
        ValueError: If the file is missing, unreadable, malformed or empty.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--corpus: {path} is not a file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(
            f"--corpus: cannot read {path} as UTF-8 text ({err})"
        ) from None
    if path.suffix.lower() not in (".jsonl", ".ndjson"):
        texts = [text] if text.strip() else []
    else:
        texts = [
            _jsonl_text(line, i + 1, path)
            for i, line in enumerate(text.split("\n"))
            if line.strip()
        ]
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ValueError(f"--corpus: {path} holds no text")
    return texts


def _jsonl_text(line: str, number: int, path: Path) -> str:
    try:
        value = json.loads(line)
    except ValueError:
        raise ValueError(f"--corpus: line {number} of {path} is not JSON") from None
    if isinstance(value, dict):
        value = value.get("text")
    if not isinstance(value, str):
        raise ValueError(
            f"--corpus: line {number} of {path}: expected a string or an object "
            "with a string 'text'"
        )
    return value


def start_token(tokenizer: Any) -> int:
    r"""The token sampled sequences start from: BOS, else EOS."""
    token = tokenizer.bos_token_id
    token = tokenizer.eos_token_id if token is None else token
    if token is None:
        raise ValueError("tokenizer: has neither a BOS nor an EOS token to start from")
    return int(token)


def sample_batch(
    parts: ModelParts,
    tokenizer: Any,
    recorder: StateRecorder,
    batch: int,
    length: int,
) -> Tensor:
    r"""
    Samples ``batch`` sequences of ``length`` tokens from the model (the start
    token, then ``length − 1`` tokens drawn at temperature 1 from the full
    distribution, end-of-sequence tokens suppressed so every sequence has the
    same length), recording their states; draws from torch's global generator,
    which the caller seeds.

    Args:

        parts (ModelParts): The model's parts.
        tokenizer (PreTrainedTokenizerBase): Its tokenizer.
        recorder (StateRecorder): Entered, without ``stop``.
        batch (int): Sequences sampled together.
        length (int): Tokens per sequence, ``>= 2``.

    Returns:
        *Tensor* ``(batch, length)``: the ids, on the CPU.
    """
    device = next(parts.model.parameters()).device
    ids = torch.full((batch, 1), start_token(tokenizer), device=device)
    recorder.set_mask(None)
    model: Any = parts.model  # a Hugging Face model: ``generate`` is untyped
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=length - 1,
            min_new_tokens=length - 1,
            pad_token_id=pad_token_id(tokenizer),
        )
    return out.cpu()


def corpus_windows(tokenizer: Any, texts: Sequence[str], length: int) -> List[Tensor]:
    r"""
    Each text's ids (with the tokenizer's special tokens), cut into windows of
    at most ``length`` tokens; windows of one token are left out (the first
    position of a window is never fitted).

    Args:

        tokenizer (PreTrainedTokenizerBase): The model's tokenizer.
        texts (list[str]): The corpus.
        length (int): Tokens per window.

    Returns:
        *list[Tensor]*: 1-D ids per window.
    """
    windows = []
    for text in texts:
        ids = torch.as_tensor(tokenizer(text)["input_ids"], dtype=torch.long)
        windows += [w for w in ids.split(length) if len(w) > 1]
    return windows


def record_windows(
    parts: ModelParts, tokenizer: Any, recorder: StateRecorder, windows: List[Tensor]
) -> None:
    r"""
    Runs ``windows`` (one batch, left-padded) through the model's blocks only,
    recording their states.

    Args:

        parts (ModelParts): The model's parts.
        tokenizer (PreTrainedTokenizerBase): Its tokenizer.
        recorder (StateRecorder): Entered, with ``stop=True``.
        windows (list[Tensor]): 1-D ids.
    """
    ids, mask = left_pad(windows, pad_token_id(tokenizer))
    device = next(parts.model.parameters()).device
    record_forward(
        parts.model,
        recorder,
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        position_ids=position_ids_from_mask(mask).to(device),
    )
