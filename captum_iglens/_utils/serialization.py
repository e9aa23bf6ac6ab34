r"""
The one JSON format of every result type: plain values only (loading never runs
code), a ``kind`` tag so that a file is never read as the wrong type, and atomic
writes so that an interrupted save never leaves a half-written file.
"""

import json
import math
import os
import secrets
import sys
from pathlib import Path
from typing import Any, ClassVar, Dict, Type, TypeVar, Union

import numpy as np

from captum_iglens._utils.output_paths import PathLike, check_writable
from captum_iglens._utils.schema import SURROGATE, MAX_DEPTH, check_plain

#: The version of the file format; a file with another is refused.
FORMAT = 1

D = TypeVar("D", bound="JsonDocument")


def plain(value: Any) -> Any:
    r"""JSON-ready: tensors and arrays as nested lists, NaN and inf as None,
    NumPy scalars as Python numbers, tuples as lists."""
    torch = sys.modules.get("torch")  # a tensor exists only once torch is imported
    if isinstance(value, np.ndarray) or (
        torch is not None and isinstance(value, torch.Tensor)
    ):
        return plain(value.tolist())
    if isinstance(value, np.generic):
        return plain(value.item())
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_atomic(path: PathLike, data: Union[str, bytes]) -> None:
    r"""Writes ``data`` (text as UTF-8, or bytes) to ``path`` through a new
    temporary file in the same folder (created with the usual permissions, those
    the umask leaves), renamed over ``path`` only when complete. A link is
    followed, so the file it points to is replaced and the link stays; a path
    that exists and is not a regular file (a device, a FIFO) is refused."""
    path = Path(os.path.realpath(path))
    if path.exists() and not path.is_file():
        raise ValueError(f"path: {path} exists and is not a regular file")
    partial = path.parent / f".{path.name}.{secrets.token_hex(8)}"
    handle = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def remove_partials(folder: PathLike) -> None:
    r"""Removes the temporary files that :func:`write_atomic` calls killed
    before their rename (``kill -9``) left in ``folder``: the files named
    ``.NAME.`` and 16 hex digits. Only for a folder no other process is
    writing.

    Args:

        folder (str or Path): The folder; its subfolders are left alone.
    """
    for path in Path(folder).glob(".*.*"):
        stem, _, tag = path.name.rpartition(".")
        if stem and len(tag) == 16 and set(tag) <= set("0123456789abcdef"):
            path.unlink(missing_ok=True)


def save_json(path: PathLike, kind: str, data: Dict[str, Any]) -> None:
    r"""Writes ``data`` as a tagged JSON document, atomically."""
    check_writable(path, "path")
    document = {"kind": kind, "format": FORMAT, **plain(data)}
    text = json.dumps(document, ensure_ascii=False, allow_nan=False)
    if SURROGATE.search(text):
        check_plain(document)  # names the field whose text cannot be written
    write_atomic(path, text)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_json(text: str, where: Any) -> Any:
    r"""
    Parses JSON text that will be loaded as a result (a file, or one line of a
    results file): NaN and infinities are refused, and so are nesting deeper
    than :data:`~captum_iglens._utils.schema.MAX_DEPTH` levels and text with
    lone surrogates. Raises ``ValueError`` starting with ``where``.
    """
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not a JSON file ({error})") from None
    except RecursionError:
        raise ValueError(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    try:
        check_plain(data)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    return data


def load_json(path: PathLike, kind: str) -> Dict[str, Any]:
    r"""Reads a document written by :func:`save_json` for ``kind``.

    Raises:
        ValueError: If the file is not JSON, has no ``kind`` or another one,
            another format, NaN or infinite numbers, nesting deeper than
            :data:`~captum_iglens._utils.schema.MAX_DEPTH` or text with lone
            surrogates.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not a UTF-8 JSON file ({error})") from None
    data = parse_json(text, path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    if "kind" not in data:
        raise ValueError(f"{path}: kind: missing; expected {kind!r}")
    found = data.pop("kind")
    if found != kind:
        raise ValueError(f"{path}: holds a {found}; expected a {kind} file")
    version = data.pop("format", FORMAT)
    if version != FORMAT:
        raise ValueError(f"{path}: file format {version!r}, expected {FORMAT}")
    return data


class JsonDocument:
    r"""
    Save and load for a result type, written once: a subclass names its ``KIND``
    and provides ``to_dict`` and a validating ``from_dict``.
    """

    KIND: ClassVar[str]

    def to_dict(self) -> Dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_dict(cls: Type[D], data: Dict[str, Any]) -> D:
        raise NotImplementedError

    def save(self, path: PathLike) -> None:
        r"""Writes the result as JSON, atomically (no pickle: loading it never
        runs code)."""
        save_json(path, self.KIND, self.to_dict())

    @classmethod
    def load(cls: Type[D], path: PathLike) -> D:
        r"""Reads a result written by :meth:`save`; a malformed or inconsistent
        file raises ``ValueError`` naming the field."""
        data = load_json(path, cls.KIND)
        try:
            return cls.from_dict(data)
        except (ValueError, TypeError) as error:
            raise ValueError(f"{path}: {error}") from None
