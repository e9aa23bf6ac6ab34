r"""Per-layer affine translators, ``T_i(h) = h + W_i h + b_i``, and their files.

A learned readout reads hidden state ``i`` as ``R(T_i(h))``, with ``R`` the
model's own final norm, head and final transforms. State ``0`` is the input of
the first block (the embedding output, and the start of a path), state ``i`` the
output of block ``i`` (1-based), for ``i`` in ``0 .. L-1``; the last block's
output (state ``L``) has no translator: it is read by the model's own readout,
so ``f_L(h_L)`` stays the model's probability.

:class:`Translators` holds the ``L`` deltas from the identity and the biases.
Its folder is the tuned-lens checkpoint layout (Belrose et al. 2023), so a
folder written here loads in the ``tuned-lens`` package and one written there
loads here: ``params.pt`` with ``"{i}.weight"`` ``(d, d)`` (``W_i``, applied as
``h @ W_i.T``, as ``nn.Linear`` does) and ``"{i}.bias"`` ``(d,)``, and
``config.json`` with ``d_model``, ``num_hidden_layers``, ``bias``,
``lens_type`` and ``base_model_name_or_path`` (plus this project's
``unembed_sha256``, which other readers ignore).
"""

import hashlib
import io
import json
import os
import secrets
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

import torch
from torch import nn, Tensor

from captum_iglens._utils.output_paths import check_folder
from captum_iglens._utils.serialization import write_atomic

PARAMS = "params.pt"
CONFIG = "config.json"
#: ``lens_type`` of the tuned-lens package's affine translators.
TUNED_LENS_TYPE = "linear_tuned_lens"

PathLike = Union[str, Path]


class Translators(nn.Module):
    r"""
    The affine translators of a learned readout, one per hidden state ``0 ..
    L-1`` (see the module's docstring): ``T_i(h) = h + h @ weight[i].T +
    bias[i]``.

    Args:

        weight (Tensor): ``(L, d, d)``, the deltas ``W_i`` from the identity.
        bias (Tensor, optional): ``(L, d)``. None: no bias (zeros).
                    Default: None
        base_model (str, optional): The model the translators were made for
                    (``base_model_name_or_path``). Default: ``""``
        unembed_sha256 (str, optional): :func:`unembedding_hash` of that model,
                    checked by :meth:`check_model`. Default: None (not checked)
        lens_type (str, optional): Recorded in ``config.json``.
                    Default: ``"linear_tuned_lens"``
        extra (dict, optional): Further ``config.json`` fields to keep (e.g.
                    how the translators were fitted). Default: None

    Examples::

        >>> t = Translators.identity(n_layers=30, d_model=576, base_model="smollm2")
        >>> t.save("my-lens")
        >>> Translators.load("my-lens").weight.shape
        torch.Size([30, 576, 576])
    """

    def __init__(
        self,
        weight: Tensor,
        bias: Optional[Tensor] = None,
        *,
        base_model: str = "",
        unembed_sha256: Optional[str] = None,
        lens_type: str = TUNED_LENS_TYPE,
        extra: Optional[Dict[str, Any]] = None,
    ) -> None:
        super().__init__()
        if not isinstance(weight, Tensor) or not weight.is_floating_point():
            raise TypeError("weight: expected a float tensor (L, d, d)")
        if weight.dim() != 3 or weight.shape[1] != weight.shape[2]:
            raise ValueError(
                f"weight: expected shape (L, d, d), got {tuple(weight.shape)}"
            )
        n_layers, d = weight.shape[0], weight.shape[1]
        if n_layers < 1 or d < 1:
            raise ValueError("weight: expected at least one layer and d >= 1")
        self.has_bias = bias is not None
        if bias is None:
            bias = weight.new_zeros(n_layers, d)
        if not isinstance(bias, Tensor) or tuple(bias.shape) != (n_layers, d):
            raise ValueError(
                f"bias: expected shape ({n_layers}, {d}), got "
                f"{tuple(getattr(bias, 'shape', ()))}"
            )
        if not (torch.isfinite(weight).all() and torch.isfinite(bias).all()):
            raise ValueError("weight/bias: expected finite values, got NaN or inf")
        self.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
        self.bias = nn.Parameter(
            bias.detach().to(weight.dtype).clone(), requires_grad=False
        )
        self.base_model = str(base_model)
        self.unembed_sha256 = unembed_sha256
        self.lens_type = str(lens_type)
        self.extra = dict(extra or {})
        self._cast: Dict[Tuple[torch.dtype, torch.device], Tuple[Any, ...]] = {}

    @classmethod
    def identity(
        cls, n_layers: int, d_model: int, *, bias: bool = True, **meta: Any
    ) -> "Translators":
        r"""
        ``L`` identity translators (zero deltas): read like the logit lens.

        Args:

            n_layers (int): ``L``, the model's number of blocks.
            d_model (int): ``d``, its hidden size.
            bias (bool, optional): Keep a (zero) bias. Default: True
            **meta: ``base_model``, ``unembed_sha256``, ``lens_type``, ``extra``.

        Returns:
            *Translators* with ``weight`` ``(L, d, d)`` float32 zeros.
        """
        for name, value in (("n_layers", n_layers), ("d_model", d_model)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        weight = torch.zeros(n_layers, d_model, d_model)
        return cls(weight, torch.zeros(n_layers, d_model) if bias else None, **meta)

    @property
    def n_layers(self) -> int:
        """``L``: the number of translators (the model's blocks)."""
        return self.weight.shape[0]

    @property
    def d_model(self) -> int:
        """``d``: the hidden size."""
        return self.weight.shape[1]

    def is_identity(self, index: int) -> bool:
        """Whether translator ``index`` is the identity (``index = L``, the last
        state, always is)."""
        if index == self.n_layers:
            return True
        return bool((self.weight[index] == 0).all() and (self.bias[index] == 0).all())

    def same(self, i: int, j: int) -> bool:
        """Whether translators ``i`` and ``j`` (in ``0 .. L``) are equal."""
        if i == j:
            return True
        if self.n_layers in (i, j):
            return self.is_identity(i) and self.is_identity(j)
        return bool(
            torch.equal(self.weight[i], self.weight[j])
            and torch.equal(self.bias[i], self.bias[j])
        )

    def forward(self, hidden: Tensor, index: Tensor) -> Tensor:
        r"""
        Translates every row by its state's translator.

        Args:

            hidden (Tensor): ``(N, d)`` hidden states, any float dtype.
            index (Tensor): ``(N,)`` long, each row's hidden-state index in
                        ``0 .. L``; rows of state ``L`` pass unchanged.

        Returns:
            *Tensor* ``(N, d)`` in the dtype of ``hidden``, differentiable with
            respect to it.
        """
        weight, bias = self._params(hidden.dtype, hidden.device)
        index = index.to(hidden.device)
        out = hidden
        for i in index.unique().tolist():
            if i == self.n_layers:
                continue
            if not 0 <= i < self.n_layers:
                raise ValueError(
                    f"layer: hidden-state index {i} outside 0..{self.n_layers}"
                )
            rows = (index == i).nonzero()[:, 0]
            h = hidden.index_select(0, rows)
            out = out.index_copy(0, rows, h + h @ weight[i].T + bias[i])
        return out

    def _params(
        self, dtype: torch.dtype, device: torch.device
    ) -> Tuple[Tensor, Tensor]:
        """The parameters in ``dtype`` on ``device``, cast once per version of
        the parameters (cast again after ``load_state_dict`` or an in-place
        change)."""
        version = tuple((p._version, p.data_ptr()) for p in (self.weight, self.bias))
        found = self._cast.get((dtype, device))
        if found is None or found[0] != version:
            found = (
                version,
                self.weight.to(device=device, dtype=dtype),
                self.bias.to(device=device, dtype=dtype),
            )
            self._cast[(dtype, device)] = found
        return found[1], found[2]

    def checksum(self) -> str:
        """SHA-256 of the parameters (float32 bytes, weight then bias): the
        identity of a learned readout that results record."""
        digest = hashlib.sha256()
        for tensor in (self.weight, self.bias):
            digest.update(_bytes(tensor.detach().float()))
        return digest.hexdigest()

    def check_model(
        self,
        d_model: int,
        n_layers: int,
        unembed_sha256: str,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        r"""
        Args:

            d_model (int): The model's hidden size.
            n_layers (int): Its number of blocks.
            unembed_sha256 (str): :func:`unembedding_hash` of its head.
            dtype (torch.dtype, optional): Its head's dtype, named in the
                        message (the hash is of the weights in their own
                        dtype). Default: None

        Raises:
            ValueError: In one sentence, if the translators were made for
                another model: another hidden size, number of blocks, or
                unembedding (when they record its hash).
        """
        if self.d_model != d_model or self.n_layers != n_layers:
            raise ValueError(
                f"lens: the translators are for a model with d_model="
                f"{self.d_model} and {self.n_layers} blocks, but this model has "
                f"d_model={d_model} and {n_layers} blocks."
            )
        if self.unembed_sha256 is not None and self.unembed_sha256 != unembed_sha256:
            raise ValueError(
                "lens: the translators were made for another model (base model "
                f"{self.base_model or 'unnamed'}): its unembedding differs from "
                f"this model's{_in_dtype(dtype)}; if it is this model in another "
                "dtype, load it in the dtype the lens was fitted with (float32 "
                "unless fit-lens was given --dtype)."
            )

    def config(self) -> Dict[str, Any]:
        """The ``config.json`` fields of the tuned-lens layout."""
        return {
            **self.extra,
            "base_model_name_or_path": self.base_model,
            "d_model": self.d_model,
            "num_hidden_layers": self.n_layers,
            "bias": self.has_bias,
            "lens_type": self.lens_type,
            "unembed_sha256": self.unembed_sha256,
        }

    def save(self, folder: PathLike) -> Path:
        r"""
        Writes the tuned-lens layout into ``folder`` (created if missing; its
        parent must exist): ``params.pt`` then ``config.json``, each written
        to a temporary file and renamed over the old one when complete.

        Returns:
            *Path* of the folder.
        """
        folder = check_folder(folder, "lens")
        folder.mkdir(exist_ok=True)
        state = {}
        for i in range(self.n_layers):
            state[f"{i}.weight"] = self.weight[i].detach().clone()
            if self.has_bias:
                state[f"{i}.bias"] = self.bias[i].detach().clone()
        buffer = io.BytesIO()
        torch.save(state, buffer)
        _write_bytes_atomic(folder / PARAMS, buffer.getvalue())
        write_atomic(folder / CONFIG, json.dumps(self.config(), indent=1))
        return folder

    @classmethod
    def load(cls, folder: PathLike) -> "Translators":
        r"""
        Reads a tuned-lens folder (``params.pt`` and ``config.json``), on the
        CPU, without running code from it (``weights_only``).

        Raises:
            ValueError: Naming the folder and what is wrong: missing files, a
                config without ``d_model`` / ``num_hidden_layers``, missing or
                extra keys, or parameters of the wrong shape.
        """
        folder = Path(folder)
        config = read_config(folder)
        try:
            state = torch.load(folder / PARAMS, map_location="cpu", weights_only=True)
        except Exception as error:  # noqa: B902 - any unreadable file is refused
            raise ValueError(
                f"lens: {folder / PARAMS} is not a readable checkpoint ({error})"
            ) from None
        weight, bias = _stack(state, config, folder)
        known = ("base_model_name_or_path", "d_model", "num_hidden_layers", "bias")
        return cls(
            weight,
            bias,
            base_model=str(config.get("base_model_name_or_path") or ""),
            unembed_sha256=config.get("unembed_sha256"),
            lens_type=str(config.get("lens_type", TUNED_LENS_TYPE)),
            extra={
                key: value
                for key, value in config.items()
                if key not in known + ("lens_type", "unembed_sha256")
            },
        )


def read_config(folder: PathLike) -> Dict[str, Any]:
    r"""
    The ``config.json`` of a tuned-lens folder, checked (cheap: for the CLI
    before the model loads).

    Raises:
        ValueError: If the folder or a file is missing, or the config lacks
            positive integer ``d_model`` and ``num_hidden_layers``.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"lens: {folder} is not a folder (expected a lens folder)")
    for name in (PARAMS, CONFIG):
        if not (folder / name).is_file():
            raise ValueError(
                f"lens: {folder} has no {name} (a lens folder holds {PARAMS} and "
                f"{CONFIG})"
            )
    try:
        config = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"lens: {folder / CONFIG} is not JSON ({error})") from None
    if not isinstance(config, dict):
        raise ValueError(f"lens: {folder / CONFIG} is not a JSON object")
    for key in ("d_model", "num_hidden_layers"):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"lens: {folder / CONFIG} needs a positive integer {key}, got {value!r}"
            )
    return config


def _stack(
    state: Any, config: Dict[str, Any], folder: Path
) -> Tuple[Tensor, Optional[Tensor]]:
    """The weights ``(L, d, d)`` and biases ``(L, d)`` (None without) of a
    ``params.pt`` state dict, checked against the config: its keys, shapes,
    finite values, and biases only where the config's ``"bias"`` (when given)
    says so."""
    n_layers, d = config["num_hidden_layers"], config["d_model"]
    if not isinstance(state, dict):
        raise ValueError(f"lens: {folder / PARAMS} does not hold a state dict")
    has_bias = "0.bias" in state
    if config.get("bias", has_bias) != has_bias:
        raise ValueError(
            f'lens: {folder / CONFIG} says "bias": {json.dumps(config["bias"])} '
            f"but {folder / PARAMS} {'holds' if has_bias else 'has no'} biases"
        )
    expected = {f"{i}.weight" for i in range(n_layers)}
    if has_bias:
        expected |= {f"{i}.bias" for i in range(n_layers)}
    if set(state) != expected:
        wrong = sorted(set(state) ^ expected)[:4]
        raise ValueError(
            f"lens: {folder / PARAMS} does not hold the {n_layers} translators of "
            f"its config (keys missing or extra: {wrong})"
        )
    for key, value in state.items():
        shape = (d, d) if key.endswith("weight") else (d,)
        if not isinstance(value, Tensor) or tuple(value.shape) != shape:
            raise ValueError(
                f"lens: {folder / PARAMS}: {key} should have shape {shape}, got "
                f"{tuple(getattr(value, 'shape', ()))}"
            )
        if not torch.isfinite(value).all():
            raise ValueError(
                f"lens: {folder / PARAMS}: {key} (translator {key.split('.')[0]}) "
                "holds NaN or inf"
            )
    weight = torch.stack([state[f"{i}.weight"].float() for i in range(n_layers)])
    if not has_bias:
        return weight, None
    return weight, torch.stack([state[f"{i}.bias"].float() for i in range(n_layers)])


def unembedding_hash(head: nn.Module) -> str:
    r"""SHA-256 of the unembedding's weight bytes (its own dtype), the identity
    of the model a lens was made for; ``""`` for a head without a weight."""
    weight = getattr(head, "weight", None)
    if not isinstance(weight, Tensor):
        return ""
    return hashlib.sha256(_bytes(weight.detach())).hexdigest()


def _in_dtype(dtype: Optional[torch.dtype]) -> str:
    """`` (in bfloat16)`` for the message of :meth:`Translators.check_model`."""
    return "" if dtype is None else f" (in {str(dtype).replace('torch.', '')})"


def _bytes(tensor: Tensor) -> Any:
    """The raw bytes of ``tensor`` as a buffer (no copy on the CPU)."""
    flat = tensor.to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy()


def _write_bytes_atomic(path: Path, data: bytes) -> None:
    """``data`` to ``path`` through a temporary file renamed when complete."""
    partial = path.parent / f".{path.name}.{secrets.token_hex(8)}"
    try:
        with open(partial, "xb") as out:
            out.write(data)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
