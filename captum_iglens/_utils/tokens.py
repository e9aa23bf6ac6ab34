r"""Token ids as text, one token at a time: what results show for their
targets."""

import functools
import re
from typing import Any, Dict, List, Optional, Sequence


def decode_tokens(tokenizer: Any, ids: Sequence[int]) -> List[str]:
    r"""
    Each token id as its own text. A token that holds only part of a multi-byte
    character (CJK, emoji, ... split by byte-level BPE or byte fallback) decodes
    to U+FFFD on its own; its bytes are then shown, the complete characters as
    text and the partial ones as escapes (``"\xe6\x97"``), so no two such
    tokens look alike.

    Args:

        tokenizer (PreTrainedTokenizerBase): Any tokenizer with ``decode``.
        ids (list[int]): Token ids.

    Returns:
        *list[str]*: one text per id.
    """
    texts = []
    for i in ids:
        text = tokenizer.decode([int(i)])
        raw = _token_bytes(tokenizer, int(i)) if "\ufffd" in text else None
        texts.append(text if raw is None else raw.decode("utf-8", "backslashreplace"))
    return texts


_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _token_bytes(tokenizer: Any, token_id: int) -> Optional[bytes]:
    """The raw bytes of a byte-level (GPT-2 style) or byte-fallback
    (``<0xE6>``) token; None when the tokenizer has neither."""
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    piece = convert(token_id) if callable(convert) else None
    if not isinstance(piece, str):
        return None
    fallback = _BYTE_FALLBACK.fullmatch(piece)
    if fallback:
        return bytes([int(fallback.group(1), 16)])
    byte_of = _byte_decoder()
    if piece and all(char in byte_of for char in piece):
        return bytes(byte_of[char] for char in piece)
    return None


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> Dict[str, int]:
    """Byte-level BPE's printable stand-ins for the 256 byte values, inverted."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\xa1"), ord("\xac") + 1),
        *range(ord("\xae"), ord("\xff") + 1),
    ]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def single_token_id(tokenizer: Any, text: str, name: str) -> int:
    r"""
    The id of the one token that ``text`` encodes to (no special tokens added).

    Raises:
        ValueError: Naming ``name``, if ``text`` is empty, encodes to more or
            fewer than one token, or to the unknown token.
    """
    if not isinstance(text, str) or not text:
        raise ValueError(f"{name}: expected a non-empty string, got {text!r}")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(
            f"{name}: {text!r} is {len(ids)} tokens {ids}, expected a single token "
            "(try it with or without a leading space)"
        )
    unknown = getattr(tokenizer, "unk_token", None)
    if ids[0] == getattr(tokenizer, "unk_token_id", None) and text != unknown:
        raise ValueError(
            f"{name}: {text!r} is not in the vocabulary (it encodes to the unknown "
            f"token {unknown!r}); give a token the tokenizer knows"
        )
    return int(ids[0])
