r"""
The one JSON format of every result type: plain values only (loading never runs
code), a ``kind`` tag so that a file is never read as the wrong type, and atomic
writes so that an interrupted save never leaves a half-written file.
"""

import json
import math
import os
import secrets
from pathlib import Path
from typing import Any, ClassVar, Dict, Iterator, Sequence, Tuple, Type, TypeVar, Union

import numpy as np
import torch
from torch import Tensor

#: The version of the file format; a file with another is refused.
FORMAT = 1

PathLike = Union[str, Path]
D = TypeVar("D", bound="JsonDocument")


def plain(value: Any) -> Any:
    r"""JSON-ready: tensors and arrays as nested lists, NaN and inf as None,
    NumPy scalars as Python numbers, tuples as lists."""
    if isinstance(value, (Tensor, np.ndarray)):
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


def check_writable(path: PathLike, what: str) -> Path:
    r"""The path of an output file, checked before any work: its folder must exist
    and be writable, and the path must not be a folder or a read-only file.
    Raises ``ValueError`` naming ``what``."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{what}: {path} is a folder; expected a file path")
    _check_folder_exists(path.parent, what)
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{what}: {path} exists and is read-only")
    return path


def check_folder(path: PathLike, what: str) -> Path:
    r"""The path of an output folder, checked before any work: an existing,
    writable folder, or a new one whose parent is an existing, writable folder.
    Raises ``ValueError`` naming ``what``."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what}: {path} is a file; expected a folder")
    _check_folder_exists(path if path.exists() else path.parent, what)
    return path


def _check_folder_exists(folder: Path, what: str) -> None:
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{what}: {folder} is a file, not a folder")
    if not folder.is_dir():
        raise ValueError(f"{what}: the folder {folder} does not exist")
    # Tried, not asked: os.access says yes to root on /proc or a read-only share.
    probe = folder / f".captum-iglens-probe.{secrets.token_hex(8)}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as error:
        raise ValueError(
            f"{what}: cannot write in the folder {folder} ({error.strerror})"
        ) from None


def write_atomic(path: PathLike, text: str) -> None:
    r"""Writes ``text`` to ``path`` through a new temporary file in the same
    folder (created with the usual permissions, those the umask leaves), renamed
    over ``path`` only when complete."""
    path = Path(path)
    partial = path.parent / f".{path.name}.{secrets.token_hex(8)}"
    handle = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def save_json(path: PathLike, kind: str, data: Dict[str, Any]) -> None:
    r"""Writes ``data`` as a tagged JSON document, atomically."""
    check_writable(path, "path")
    document = {"kind": kind, "format": FORMAT, **plain(data)}
    write_atomic(path, json.dumps(document, ensure_ascii=False, allow_nan=False))


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def load_json(path: PathLike, kind: str) -> Dict[str, Any]:
    r"""Reads a document written by :func:`save_json` for ``kind``.

    Raises:
        ValueError: If the file is not JSON, holds another kind of result or
            another format, or contains NaN or infinite numbers.
    """
    path = Path(path)
    try:
        data = json.loads(
            path.read_text(encoding="utf-8"), parse_constant=_refuse_constant
        )
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not a JSON file ({error})") from None
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    found = data.pop("kind", kind)
    if found != kind:
        raise ValueError(f"{path}: holds a {found}; expected a {kind} file")
    version = data.pop("format", FORMAT)
    if version != FORMAT:
        raise ValueError(f"{path}: file format {version!r}, expected {FORMAT}")
    return data


def tensor_field(
    data: Dict[str, Any], name: str, dtype: torch.dtype, shape: Sequence[int]
) -> Tensor:
    r"""Field ``name`` of a loaded document as a tensor of ``dtype`` and ``shape``
    (``-1`` for any size). Raises ``ValueError`` naming the field when it is
    missing, ragged, of the wrong shape, or holds values of the wrong type
    (booleans for a mask, integers for ids, finite numbers for floats)."""
    if name not in data:
        raise ValueError(f"{name}: missing")
    value = data[name]
    leaf_type, what = _LEAVES[dtype]
    for leaf in _leaves(value):
        if not _is(leaf, leaf_type):
            raise ValueError(f"{name}: expected {what}, found {leaf!r}")
    try:
        tensor = torch.tensor(value, dtype=dtype)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"{name}: expected a rectangular nested list") from None
    if tensor.numel() == 0:
        # Nested lists keep no shape when a dimension is empty.
        zero = tuple(0 if n == -1 else n for n in shape)
        if math.prod(zero) == 0:
            tensor = tensor.reshape(zero)
    if not _shape_matches(tuple(tensor.shape), shape):
        raise ValueError(
            f"{name}: expected shape {_shape_text(shape)}, got {tuple(tensor.shape)}"
        )
    if tensor.is_floating_point() and not torch.isfinite(tensor).all():
        raise ValueError(f"{name}: expected finite numbers")
    return tensor


_LEAVES = {
    torch.bool: (bool, "booleans"),
    torch.long: (int, "integers"),
    torch.float32: (float, "finite numbers"),
}


def _is(leaf: Any, leaf_type: type) -> bool:
    if leaf_type is bool:
        return isinstance(leaf, bool)
    if leaf_type is int:
        return isinstance(leaf, int) and not isinstance(leaf, bool)
    return isinstance(leaf, (int, float)) and not isinstance(leaf, bool)


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


def _shape_matches(found: Tuple[int, ...], expected: Sequence[int]) -> bool:
    return len(found) == len(expected) and all(
        e == -1 or f == e for f, e in zip(found, expected)
    )


def _shape_text(shape: Sequence[int]) -> str:
    return "(" + ", ".join("any" if n == -1 else str(n) for n in shape) + ")"


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
