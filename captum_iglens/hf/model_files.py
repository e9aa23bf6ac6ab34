r"""
What can be read of a model from its files before it loads, without importing
torch or transformers: where the caches are (:func:`cache_root`), the folder of a
model name (an embedded model's converted cache, or a local folder), its
``config.json`` and its tokenizer's ``tokenizer.json``. The command line checks
options against them at once (``--layers 999``, ``--foil``), and again against
the loaded model where the files cannot be read.
"""

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

PathLike = Union[str, Path]

#: The cache folder of each embedded model, by short name (``--model gemma3``).
EMBEDDED_FOLDERS: Dict[str, str] = {
    "smollm2": "SmolLM2-135M-Instruct",
    "gemma3": "gemma-3-270m",
}
#: The default model's full name.
DEFAULT_MODEL = EMBEDDED_FOLDERS["smollm2"]


def cache_root(cache_dir: Optional[PathLike] = None) -> Path:
    r"""
    The root folder of the caches (models, and fitted lenses under ``lenses/``).

    Args:
        cache_dir (str or Path, optional): An explicit root. Default: None
                    (``$CAPTUM_IGLENS_CACHE``, else ``$XDG_CACHE_HOME/captum_iglens``,
                    else ``~/.cache/captum_iglens``).

    Returns:
        *Path* (it may not exist yet).
    """
    return _cache_root(cache_dir)


def _cache_root(cache_dir: Optional[PathLike]) -> Path:
    if cache_dir is not None:
        root, what = Path(cache_dir).expanduser(), "cache_dir"
    elif os.environ.get("CAPTUM_IGLENS_CACHE"):
        root = Path(os.environ["CAPTUM_IGLENS_CACHE"]).expanduser()
        what = "CAPTUM_IGLENS_CACHE"
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
        root, what = base / "captum_iglens", "the model cache"
    existing = next((p for p in (root, *root.parents) if p.exists()), root)
    if not existing.is_dir():
        raise ValueError(
            f"{what}: {existing} is a file; point CAPTUM_IGLENS_CACHE at a folder"
        )
    return root


def model_folder(model: Optional[str]) -> Path:
    r"""
    The folder of a model name as the command line takes it.

    Args:

        model (str, optional): An embedded model's short name, a local folder,
                    or None for the default model.

    Returns:
        *Path*: The embedded model's converted cache (which may not exist
        yet), else ``model`` as a path.
    """
    if model is None or model in EMBEDDED_FOLDERS:
        return cache_root() / EMBEDDED_FOLDERS[model or "smollm2"]
    return Path(model)


def read_text_config(model: Optional[str]) -> Optional[Dict[str, Any]]:
    r"""
    The text model's settings in the ``config.json`` of ``model``
    (:func:`model_folder`) where one can be read before the load: the file's
    object, or its ``text_config`` where it has one (a multimodal model).

    Returns:
        *dict* or None: None where there is no readable JSON object (a
        ``.gguf`` file, a cache not converted yet): the load reports it.
    """
    try:
        text = (model_folder(model) / "config.json").read_text(encoding="utf-8")
        config = json.loads(text)
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) and inner else config


class FileTokenizer:
    r"""
    A model's fast tokenizer read from its ``tokenizer.json`` alone, called as
    a Hugging Face tokenizer is for plain text (``tokenizer(text,
    add_special_tokens=False)["input_ids"]``): enough to check single tokens
    before the model and its ``transformers`` tokenizer load, which wraps the
    same file.

    Args:

        path (Path): The ``tokenizer.json``.
    """

    unk_token: Optional[str] = None
    unk_token_id: Optional[int] = None

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self.backend = Tokenizer.from_file(str(path))

    def __call__(
        self, text: str, add_special_tokens: bool = True
    ) -> Dict[str, List[int]]:
        ids = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        return {"input_ids": list(ids)}


def read_tokenizer(model: Optional[str]) -> Optional[FileTokenizer]:
    r"""
    The tokenizer of ``model`` (:func:`model_folder`) read from its
    ``tokenizer.json`` (:class:`FileTokenizer`), or None where there is none
    that can be read (the loaded tokenizer is then checked).
    """
    path = model_folder(model) / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        return FileTokenizer(path)
    except Exception:  # noqa: BLE001 - any unreadable file: the load reports it
        return None
