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
field (``methods.dla.scores``, ``tokens[3].drops``) and what was expected. The
same declaration checks a value built in memory: ``SCHEMA.check(values)`` takes
the fields as the class holds them (tensors, not nested lists), so that a
dataclass's ``__post_init__`` checks what its file would (shapes, dtypes, sizes
and bounds) without declaring any of it again.

Sizes are named (``"B"``, ``"k"``, ``"k+1"``): the first field that shows a size
sets it, every later field must agree, and a mismatch names both fields. Keys
not declared are refused, unless the record is ``open`` (free-form settings).
"""

import math
import re
from typing import (
    Any,
    Dict,
    Iterable,
    List,
    NoReturn,
    Optional,
    Set,
    Tuple,
    Type,
    Union,
)

import numpy as np

#: The deepest nesting of lists and objects a result file may hold.
MAX_DEPTH = 32
#: How far a float may pass the bounds of its :class:`Array` (float rounding).
ROUNDING = 1e-4

SURROGATE = re.compile("[\ud800-\udfff]")
_DIM = re.compile(r"^([A-Za-z_]\w*)(?:\+(\d+))?$")


class Context:
    r"""What the fields of one document share while it loads: the sizes set so
    far (and which field set each) and the named sets of keys."""

    def __init__(self) -> None:
        self.sizes: Dict[str, int] = {}
        self.origin: Dict[str, str] = {}
        self.names: Dict[str, List[str]] = {}
        self.positive: Set[str] = set()

    def size(self, dim: str, found: int, at: str, what: str) -> None:
        r"""Sets size ``dim`` (``"k"``, or ``"k+1"`` meaning k plus one) to
        ``found``, or checks ``found`` against it. A size named in
        :attr:`positive` is at least one."""
        name, extra = _parse_dim(dim)
        if name not in self.sizes:
            least = extra + (name in self.positive)
            if found < least:
                fail(at, f"expected {what} of at least {least}, got {found}")
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


def fail(at: str, message: str, error: Type[Exception] = ValueError) -> NoReturn:
    r"""Raises the ``ValueError`` (or ``error``) of a field."""
    raise error(f"{at or 'file'}: {message}")


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


class Spec:
    r"""How one field is checked and converted on load, and checked in memory."""

    #: Whether the field may be missing (then the class default applies).
    optional = False

    def load(self, value: Any, at: str, ctx: Context) -> Any:
        r"""The field's value, converted; ``at`` names it in errors."""
        raise NotImplementedError

    def check(self, value: Any, at: str, ctx: Context) -> Any:
        r"""The field's value as a class holds it, checked and returned as it
        is; by default as on load (the value is held as the file writes it)."""
        return self.load(value, at, ctx)


class Maybe(Spec):
    r"""A field that may be missing or null (then None) or else holds ``spec``."""

    optional = True

    def __init__(self, spec: Spec) -> None:
        self.spec = spec

    def load(self, value: Any, at: str, ctx: Context) -> Any:
        return None if value is None else self.spec.load(value, at, ctx)

    def check(self, value: Any, at: str, ctx: Context) -> Any:
        return None if value is None else self.spec.check(value, at, ctx)


class Default(Spec):
    r"""A field that may be missing (then the class default applies)."""

    optional = True

    def __init__(self, spec: Spec) -> None:
        self.spec = spec

    def load(self, value: Any, at: str, ctx: Context) -> Any:
        return self.spec.load(value, at, ctx)

    def check(self, value: Any, at: str, ctx: Context) -> Any:
        return self.spec.check(value, at, ctx)


class Text(Spec):
    r"""A string, optionally one of ``choices``; with ``nonempty``, not ``""``."""

    def __init__(self, choices: Iterable[str] = (), nonempty: bool = False) -> None:
        self.choices = tuple(choices)
        self.nonempty = nonempty

    def load(self, value: Any, at: str, ctx: Context) -> Any:
        if not isinstance(value, str):
            fail(at, f"expected a string, got {_kind(value)}")
        if self.nonempty and not value:
            fail(at, "expected a non-empty string")
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


def _torch_dtype(name: str) -> Any:
    """The torch dtype of an :class:`Array` leaf type (float32, long, bool)."""
    import torch

    return {"float": torch.float32, "int": torch.long, "bool": torch.bool}[name]


class Array(Spec):
    r"""
    A rectangular nested list of ``dtype`` leaves (``"float"``, ``"int"`` or
    ``"bool"``) whose sizes are ``dims``; a torch tensor (float32, long, bool),
    or with ``numpy`` a NumPy array (float64, int64, bool). With ``nullable``,
    null leaves read as NaN (floats only). Values lie in ``[low, high]`` where
    those are given (floats up to :data:`ROUNDING`).
    """

    _NUMPY = {"float": np.float64, "int": np.int64, "bool": np.bool_}

    def __init__(
        self,
        dtype: str,
        *dims: str,
        numpy: bool = False,
        nullable: bool = False,
        low: Optional[float] = None,
        high: Optional[float] = None,
    ) -> None:
        self.dtype, self.dims, self.numpy, self.nullable = dtype, dims, numpy, nullable
        self.low, self.high = low, high

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
            return self._values(array, at)
        import torch  # on use: reading a schema's plain fields imports no torch

        return self._values(torch.from_numpy(array).to(_torch_dtype(self.dtype)), at)

    def check(self, value: Any, at: str, ctx: Context) -> Any:
        r"""A tensor (a NumPy array with ``numpy``) of the declared dtype, whose
        sizes agree with those set so far; raises ``TypeError`` for another
        type or dtype."""
        import torch

        kind, name, dtype = (
            (np.ndarray, "NumPy array", self._NUMPY[self.dtype])
            if self.numpy
            else (torch.Tensor, "tensor", _torch_dtype(self.dtype))
        )
        if not isinstance(value, kind):
            fail(at, f"expected a {name}, got {_kind(value)}", TypeError)
        if value.dtype != dtype:
            fail(at, f"expected dtype {dtype}, got {value.dtype}", TypeError)
        if value.ndim != len(self.dims):
            fail(
                at,
                f"expected shape ({', '.join(self.dims)}), got {tuple(value.shape)}",
            )
        for dim, found in zip(self.dims, value.shape):
            ctx.size(dim, found, at, f"size along {dim}")
        return self._values(value, at)

    def _values(self, value: Any, at: str) -> Any:
        """``value``, its numbers checked: finite (NaN allowed in NumPy arrays,
        for null) and within the bounds."""
        if self.dtype == "float":
            if self.numpy and np.isinf(value).any():
                fail(at, "expected finite numbers")
            if not self.numpy and not value.isfinite().all():
                fail(at, "expected finite float32 numbers, found NaN or inf")
        slack = ROUNDING if self.dtype == "float" else 0
        below = self.low is not None and bool((value < self.low - slack).any())
        above = self.high is not None and bool((value > self.high + slack).any())
        if below or above:
            found = value.min() if below else value.max()
            fail(at, f"expected values {self._range()}, found {float(found):g}")
        return value

    def _range(self) -> str:
        if self.high is None:
            return f">= {self.low:g}"
        if self.low is None:
            return f"<= {self.high:g}"
        return f"in [{self.low:g}, {self.high:g}]"

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
    with ``every``, each of those keys but the ``optional`` ones must be
    present (else a subset is allowed); with ``nonempty``, at least one key.
    """

    def __init__(
        self,
        value: Spec,
        keys: Union[str, Tuple[str, ...]] = (),
        every: bool = True,
        nonempty: bool = False,
        optional: Tuple[str, ...] = (),
    ) -> None:
        self.value, self.keys, self.every = value, keys, every
        self.nonempty = nonempty
        self.optional_keys = optional

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
            missing = [
                key
                for key in allowed
                if key not in value and key not in self.optional_keys
            ]
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
    the columns of one method's map); those named in ``positive`` are at least
    one. ``stored_as`` maps a field to the key its file uses when the two
    names differ (a field renamed, its files unchanged).
    """

    def __init__(
        self,
        open: bool = False,
        local: Tuple[str, ...] = (),
        positive: Tuple[str, ...] = (),
        stored_as: Optional[Dict[str, str]] = None,
        **fields: Spec,
    ) -> None:
        self.open, self.local, self.positive = open, local, positive
        self.stored_as = dict(stored_as or {})
        self.fields = fields

    def extended(self, **fields: Spec) -> "Record":
        r"""This record with more fields, declared after its own."""
        out = Record(self.open, self.local, self.positive, self.stored_as)
        out.fields = {**self.fields, **fields}
        return out

    def fields_of(self, kind: Type[Spec]) -> Tuple[str, ...]:
        r"""The fields whose spec, optional or not, is a ``kind``."""
        return tuple(
            name
            for name, spec in self.fields.items()
            if isinstance(spec, kind)
            or (isinstance(spec, (Maybe, Default)) and isinstance(spec.spec, kind))
        )

    def label(self, name: str) -> str:
        r"""Field ``name`` as an error names it: with its stored key when the
        two differ, so that the message fits a file and a call alike."""
        key = self.stored_as.get(name, name)
        return name if key == name else f"{name} (stored as {key!r})"

    def dump(self, values: Dict[str, Any]) -> Dict[str, Any]:
        r"""``values`` keyed as the file stores them (see ``stored_as``)."""
        return {self.stored_as.get(key, key): value for key, value in values.items()}

    def load(self, value: Any, at: str = "", ctx: Any = None) -> Dict[str, Any]:
        r"""The declared fields present in the file's object ``value``,
        converted and keyed by field (and, when open, the others as they
        are)."""
        return self._fields(value, at, ctx, stored=True)

    def check(self, value: Any, at: str = "", ctx: Any = None) -> Dict[str, Any]:
        r"""``value``, the fields as a class holds them, checked; errors name
        the fields (not their stored keys)."""
        return self._fields(value, at, ctx, stored=False)

    def _fields(
        self, value: Any, at: str, ctx: Optional[Context], stored: bool
    ) -> Dict[str, Any]:
        ctx = Context() if ctx is None else ctx
        if not isinstance(value, dict):
            error = ValueError if stored else TypeError
            fail(at, f"expected an object, got {_kind(value)}", error)
        keys = {(self.stored_as.get(n, n) if stored else n): n for n in self.fields}
        unknown = [key for key in value if key not in keys]
        if unknown and not self.open:
            fail(at, f"unknown fields {sorted(unknown)}")
        out = {key: value[key] for key in unknown}
        ctx.positive.update(self.positive)
        outer = {name: ctx.sizes.pop(name) for name in self.local if name in ctx.sizes}
        try:
            for key, name in keys.items():
                spec = self.fields[name]
                if key not in value:
                    if not spec.optional:
                        fail(_join(at, key), "missing")
                    continue
                visit = spec.load if stored else spec.check
                out[name] = visit(value[key], _join(at, key), ctx)
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


def _leaves(value: Any, ndim: int, at: str) -> List[Any]:
    """The leaves ``ndim`` levels down, refusing lists below or leaves above."""
    level = [value]
    for _ in range(ndim):
        below: List[Any] = []
        for item in level:
            if not isinstance(item, list):
                fail(at, f"expected {ndim}-level nested lists, found {item!r:.40}")
            below.extend(item)
        level = below
    if any(isinstance(item, (list, dict)) for item in level):
        fail(at, f"expected {ndim}-level nested lists, found a deeper one")
    return level


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
