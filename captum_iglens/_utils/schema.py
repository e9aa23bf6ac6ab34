r"""
The declared schema of a result file: one declaration per field, checked on load
by one mechanism for every result kind.

A kind declares its fields as a :class:`Record` of specs, e.g.::

    SCHEMA = Record(
        layer_names=Texts("k", nonempty=True),
        attributions=Array("float", "B", "P", "k"),
        tokens=Maybe(Texts("B", "P")),
    )

and its ``from_dict`` starts with ``SCHEMA.load(data)``, which returns the
fields converted (tensors, arrays, strings) or raises ``ValueError`` naming the
field (``methods.dla.scores``, ``tokens[3].drops``) and what was expected.

Sizes are named (``"B"``, ``"k"``, ``"k+1"``): the first field that shows a size
sets it, every later field must agree, and a mismatch names both fields. Keys
not declared are refused, unless the record is ``open`` (free-form settings).
"""

import math
import re
from typing import Any, Dict, Iterable, List, NoReturn, Tuple, Union

import numpy as np
import torch

#: The deepest nesting of lists and objects a result file may hold.
MAX_DEPTH = 32

SURROGATE = re.compile("[\ud800-\udfff]")
_DIM = re.compile(r"^([A-Za-z_]\w*)(?:\+(\d+))?$")


class Context:
    r"""What the fields of one document share while it loads: the sizes set so
    far (and which field set each) and the named sets of keys."""

    def __init__(self) -> None:
        self.sizes: Dict[str, int] = {}
        self.origin: Dict[str, str] = {}
        self.names: Dict[str, List[str]] = {}

    def size(self, dim: str, found: int, at: str, what: str) -> None:
        r"""Sets size ``dim`` (``"k"``, or ``"k+1"`` meaning k plus one) to
        ``found``, or checks ``found`` against it."""
        name, extra = _parse_dim(dim)
        if name not in self.sizes:
            if found - extra < 0:
                fail(at, f"expected {what} of at least {extra}, got {found}")
            self.sizes[name], self.origin[name] = found - extra, at
            return
        want = self.sizes[name] + extra
        if found != want:
            fail(
                at,
                f"expected {what} of {want} ({dim}, set by {self.origin[name]}), "
                f"got {found}",
            )

    def known(self, dim: str) -> int:
        r"""The size of ``dim`` if set, else 0."""
        name, extra = _parse_dim(dim)
        return self.sizes[name] + extra if name in self.sizes else 0


def _parse_dim(dim: str) -> Tuple[str, int]:
    found = _DIM.match(dim)
    if found is None:
        raise ValueError(f"schema: bad size name {dim!r}")  # a declaration error
    return found.group(1), int(found.group(2) or 0)


def fail(at: str, message: str) -> NoReturn:
    r"""Raises the ``ValueError`` of a field."""
    raise ValueError(f"{at or 'file'}: {message}")


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


class Spec:
    r"""How one field is checked and converted on load."""

    #: Whether the field may be missing (then the class default applies).
    optional = False

    def load(self, value: Any, at: str, ctx: Context) -> Any:
        r"""The field's value, converted; ``at`` names it in errors."""
        raise NotImplementedError


class Maybe(Spec):
    r"""A field that may be missing or null (then None) or else holds ``spec``."""

    optional = True

    def __init__(self, spec: Spec) -> None:
        self.spec = spec

    def load(self, value: Any, at: str, ctx: Context) -> Any:
        return None if value is None else self.spec.load(value, at, ctx)


class Default(Spec):
    r"""A field that may be missing (then the class default applies)."""

    optional = True

    def __init__(self, spec: Spec) -> None:
        self.spec = spec

    def load(self, value: Any, at: str, ctx: Context) -> Any:
        return self.spec.load(value, at, ctx)


class Text(Spec):
    r"""A string, optionally one of ``choices``."""

    def __init__(self, choices: Iterable[str] = ()) -> None:
        self.choices = tuple(choices)

    def load(self, value: Any, at: str, ctx: Context) -> Any:
        if not isinstance(value, str):
            fail(at, f"expected a string, got {_kind(value)}")
        if self.choices and value not in self.choices:
            fail(at, f"expected one of {list(self.choices)}, got {value!r}")
        return value


class Integer(Spec):
    r"""An integer (not a boolean) of at least ``low``."""

    def __init__(self, low: int = 0) -> None:
        self.low = low

    def load(self, value: Any, at: str, ctx: Context) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or value < self.low:
            fail(at, f"expected an integer >= {self.low}, got {value!r:.40}")
        return value


class Number(Spec):
    r"""A finite number (not a boolean), of at least ``low`` when given; with
    ``nullable``, null reads as NaN."""

    def __init__(self, nullable: bool = False, low: float = -math.inf) -> None:
        self.nullable, self.low = nullable, low

    def load(self, value: Any, at: str, ctx: Context) -> Any:
        if value is None and self.nullable:
            return math.nan
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < self.low
        ):
            bound = "" if self.low == -math.inf else f" >= {self.low:g}"
            fail(at, f"expected a finite number{bound}, got {value!r:.40}")
        return value


class Flag(Spec):
    r"""A boolean; with ``nullable``, also null."""

    def __init__(self, nullable: bool = False) -> None:
        self.nullable = nullable

    def load(self, value: Any, at: str, ctx: Context) -> Any:
        if not (isinstance(value, bool) or (value is None and self.nullable)):
            fail(at, f"expected true or false, got {value!r:.40}")
        return value


class Json(Spec):
    r"""Free-form JSON (depth and text are checked for the whole file); with
    ``obj``, an object."""

    def __init__(self, obj: bool = True) -> None:
        self.obj = obj

    def load(self, value: Any, at: str, ctx: Context) -> Any:
        if self.obj and not isinstance(value, dict):
            fail(at, f"expected an object, got {_kind(value)}")
        return value


class Array(Spec):
    r"""
    A rectangular nested list of ``dtype`` leaves (``"float"``, ``"int"`` or
    ``"bool"``) whose sizes are ``dims``; a torch tensor (float32, long, bool),
    or with ``numpy`` a NumPy array (float64, int64, bool). With ``nullable``,
    null leaves read as NaN (floats only).
    """

    _TORCH = {"float": torch.float32, "int": torch.long, "bool": torch.bool}
    _NUMPY = {"float": np.float64, "int": np.int64, "bool": np.bool_}

    def __init__(
        self, dtype: str, *dims: str, numpy: bool = False, nullable: bool = False
    ) -> None:
        self.dtype, self.dims, self.numpy, self.nullable = dtype, dims, numpy, nullable

    def load(self, value: Any, at: str, ctx: Context) -> Any:
        sizes = _outer_sizes(value, len(self.dims), at)
        for leaf in _leaves(value, len(self.dims), at):
            if not self._leaf_ok(leaf):
                fail(at, f"expected {self._what()}, found {leaf!r:.40}")
        for dim, found in zip(self.dims, sizes):
            ctx.size(dim, found, at, f"size along {dim}")
        shape = tuple(ctx.known(dim) for dim in self.dims)
        try:
            array: np.ndarray = np.array(
                _nan_for_null(value) if self.nullable else value,
                dtype=self._NUMPY[self.dtype],
            )
        except (TypeError, ValueError, OverflowError):
            fail(at, "expected a rectangular nested list of numbers in range")
        if array.size == 0:
            array = array.reshape(shape)  # nested lists keep no empty shape
        if array.shape != shape:
            fail(at, f"expected a rectangular nested list of shape {shape}")
        if self.numpy:
            if self.dtype == "float" and np.isinf(array).any():
                fail(at, "expected finite numbers")
            return array
        tensor = torch.from_numpy(array).to(self._TORCH[self.dtype])
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            fail(at, "expected finite float32 numbers")
        return tensor

    def _leaf_ok(self, leaf: Any) -> bool:
        if self.dtype == "bool":
            return isinstance(leaf, bool)
        if isinstance(leaf, bool):
            return False
        if self.dtype == "int":
            return isinstance(leaf, int)
        return isinstance(leaf, (int, float)) or (leaf is None and self.nullable)

    def _what(self) -> str:
        what = {"bool": "booleans", "int": "integers", "float": "finite numbers"}
        return what[self.dtype] + (" or null" if self.nullable else "")


class Texts(Spec):
    r"""A rectangular nested list of strings whose sizes are ``dims`` (the
    strings themselves, as lists); with ``nonempty``, the first size >= 1."""

    def __init__(self, *dims: str, nonempty: bool = False) -> None:
        self.dims, self.nonempty = dims, nonempty

    def load(self, value: Any, at: str, ctx: Context) -> Any:
        sizes = _outer_sizes(value, len(self.dims), at)
        if self.nonempty and sizes[0] == 0:
            fail(at, "expected at least one string")
        for leaf in _leaves(value, len(self.dims), at):
            if not isinstance(leaf, str):
                fail(at, f"expected strings, found {leaf!r:.40}")
        _check_rectangular(value, len(self.dims), at)
        for dim, found in zip(self.dims, sizes):
            ctx.size(dim, found, at, f"size along {dim}")
        return value


class ListOf(Spec):
    r"""
    A list of ``item``: its length is size ``dim`` (when given); with ``names``
    the items are distinct strings kept under that name, for :class:`MapOf`'s
    ``keys``; with ``nonempty``, at least one item; ``required`` items must be
    among them.
    """

    def __init__(
        self,
        item: Spec,
        dim: str = "",
        *,
        names: str = "",
        nonempty: bool = False,
        required: Tuple[str, ...] = (),
    ) -> None:
        self.item, self.dim, self.names = item, dim, names
        self.nonempty, self.required = nonempty, required

    def load(self, value: Any, at: str, ctx: Context) -> Any:
        if not isinstance(value, list):
            fail(at, f"expected a list, got {_kind(value)}")
        if self.nonempty and not value:
            fail(at, "expected at least one entry")
        if self.dim:
            ctx.size(self.dim, len(value), at, "length")
        items = [self.item.load(v, f"{at}[{i}]", ctx) for i, v in enumerate(value)]
        if self.names:
            if len(set(items)) != len(items):
                fail(at, f"expected distinct names, got {items!r:.80}")
            ctx.names[self.names] = items
            ctx.origin[f"names of {self.names}"] = at
        missing = [name for name in self.required if name not in items]
        if missing:
            fail(at, f"expected {missing} among them")
        return items


class MapOf(Spec):
    r"""
    An object of ``value`` per key. ``keys``: a fixed tuple of names, or the
    name of a list declared with ``ListOf(..., names=...)`` earlier in the file;
    with ``every``, each of those keys must be present (else a subset is
    allowed); with ``nonempty``, at least one key.
    """

    def __init__(
        self,
        value: Spec,
        keys: Union[str, Tuple[str, ...]] = (),
        every: bool = True,
        nonempty: bool = False,
    ) -> None:
        self.value, self.keys, self.every = value, keys, every
        self.nonempty = nonempty

    def load(self, value: Any, at: str, ctx: Context) -> Any:
        if not isinstance(value, dict):
            fail(at, f"expected an object, got {_kind(value)}")
        if self.nonempty and not value:
            fail(at, "expected at least one entry")
        allowed = (
            ctx.names.get(self.keys, [])
            if isinstance(self.keys, str)
            else (list(self.keys))
        )
        if self.keys != ():
            unknown = [key for key in value if key not in allowed]
            missing = [key for key in allowed if key not in value]
            if unknown or (missing and self.every):
                source = ctx.origin.get(f"names of {self.keys}", "")
                named = f" (those of {source})" if source else ""
                fail(at, f"expected keys {allowed}{named}, got {list(value)}")
        return {k: self.value.load(v, _join(at, k), ctx) for k, v in value.items()}


class Record(Spec):
    r"""
    An object with declared fields, one spec per key (checked in declaration
    order). Keys not declared are refused, unless ``open`` (they are then kept
    as they are). Sizes named in ``local`` belong to each object alone (e.g.
    the columns of one method's map).
    """

    def __init__(
        self, open: bool = False, local: Tuple[str, ...] = (), **fields: Spec
    ) -> None:
        self.open, self.local, self.fields = open, local, fields

    def extended(self, **fields: Spec) -> "Record":
        r"""This record with more fields, declared after its own."""
        out = Record(open=self.open, local=self.local)
        out.fields = {**self.fields, **fields}
        return out

    def load(self, value: Any, at: str = "", ctx: Any = None) -> Dict[str, Any]:
        r"""The declared fields present in ``value``, converted (and, when open,
        the others as they are)."""
        ctx = Context() if ctx is None else ctx
        if not isinstance(value, dict):
            fail(at, f"expected an object, got {_kind(value)}")
        unknown = [key for key in value if key not in self.fields]
        if unknown and not self.open:
            fail(at, f"unknown fields {sorted(unknown)}")
        out = {key: value[key] for key in unknown}
        outer = {name: ctx.sizes.pop(name) for name in self.local if name in ctx.sizes}
        try:
            for key, spec in self.fields.items():
                if key not in value:
                    if not spec.optional:
                        fail(_join(at, key), "missing")
                    continue
                out[key] = spec.load(value[key], _join(at, key), ctx)
        finally:
            for name in self.local:
                ctx.sizes.pop(name, None)
            ctx.sizes.update(outer)
        return out


class Either(Spec):
    r"""The first of ``specs`` that the value satisfies (e.g. two shapes)."""

    def __init__(self, *specs: Spec) -> None:
        self.specs = specs

    def load(self, value: Any, at: str, ctx: Context) -> Any:
        errors = []
        for spec in self.specs:
            sizes, origin = dict(ctx.sizes), dict(ctx.origin)
            try:
                return spec.load(value, at, ctx)
            except ValueError as error:
                ctx.sizes, ctx.origin = sizes, origin
                errors.append(str(error).split(": ", 1)[-1])
        fail(at, " or ".join(errors))


def _join(at: str, key: str) -> str:
    return f"{at}.{key}" if at else key


def _outer_sizes(value: Any, ndim: int, at: str) -> List[int]:
    """The sizes along the first elements, down to ``ndim`` levels; a size
    under an empty list is unknown and left out."""
    sizes, level = [], value
    for _ in range(ndim):
        if not isinstance(level, list):
            fail(at, f"expected {ndim}-level nested lists, got {_kind(level)}")
        sizes.append(len(level))
        if not level:
            break
        level = level[0]
    return sizes


def _leaves(value: Any, ndim: int, at: str) -> Iterable[Any]:
    """The leaves ``ndim`` levels down, refusing lists below or leaves above."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth == ndim:
            if isinstance(item, (list, dict)):
                fail(at, f"expected {ndim}-level nested lists, found a deeper one")
            yield item
        elif not isinstance(item, list):
            fail(at, f"expected {ndim}-level nested lists, found {item!r:.40}")
        else:
            stack.extend((child, depth + 1) for child in item)


def _check_rectangular(value: Any, ndim: int, at: str) -> None:
    """Every list at one level has the same length."""
    level = [value]
    for depth in range(ndim):
        lengths = {len(item) for item in level}
        if len(lengths) > 1:
            fail(at, f"expected a rectangular nested list, level {depth} is ragged")
        level = [child for item in level for child in item]


def _nan_for_null(value: Any) -> Any:
    if isinstance(value, list):
        return [_nan_for_null(v) for v in value]
    return math.nan if value is None else value


def check_plain(data: Any, max_depth: int = MAX_DEPTH) -> None:
    r"""
    Refuses a parsed document nested deeper than ``max_depth`` or holding text
    with a lone surrogate (which no UTF-8 file or page can carry), naming where.
    """
    stack: List[Tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        item, at, depth = stack.pop()
        if depth > max_depth:
            fail(at, f"nested deeper than {max_depth} levels")
        if isinstance(item, dict):
            for key, child in item.items():
                _check_text(key, at)
                stack.append((child, _join(at, str(key)), depth + 1))
        elif isinstance(item, list):
            stack.extend(
                (child, f"{at}[{i}]", depth + 1)
                for i, child in enumerate(item)
                if isinstance(child, (list, dict, str))
            )
        elif isinstance(item, str):
            _check_text(item, at)


def _check_text(text: str, at: str) -> None:
    found = SURROGATE.search(text)
    if found:
        fail(
            at,
            f"text holds a lone surrogate (U+{ord(found.group()):04X}), which is "
            "not valid Unicode",
        )
