"""Results of every kind for the viewer's tests, made on tiny models or without
a model at all."""

import shutil

import pytest
import torch

from tests.helpers import word_tokenizer
from tests.tiny_models import VOCAB, tiny_model
from tests.viewer.synthetic import synthetic_result

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
#: The mark of the browser tests: skipped only where Chromium is not installed.
NEEDS_CHROMIUM = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="Chromium is not installed (apt-get install chromium chromium-driver); "
    ".ci/run installs it",
)
HOSTILE = [
    '<img src=x onerror="window.__pwned=1">',
    "</script><script>window.__pwned=2</script>",
]


@pytest.fixture
def hostile_result():
    """A map whose token texts are markup and script."""
    tokens = [" a", HOSTILE[0], HOSTILE[1], " b & c"]
    result = synthetic_result(4, 6, tokens=tokens)
    result.metadata["prompt"] = HOSTILE[1]
    result.top_tokens[0][1][2][0] = HOSTILE[0]
    return result


@pytest.fixture(scope="session")
def comparison_result():
    from captum_iglens.studies.comparison import compare

    torch.manual_seed(0)
    ids = torch.randint(3, VOCAB, (1, 7))
    return compare(
        tiny_model("llama"),
        ids,
        positions=[-3, -2, -1],
        methods=("dla", "ig_lens"),
        n_steps=4,
    )


@pytest.fixture(scope="session")
def validation_result():
    from captum_iglens.studies.validation import Fact, StudyOptions, run_validation
    from tests.studies.validation.test_study import CharTokenizer

    prompts = [Fact("a", "r", "abc", "x"), Fact("b", "r", "hello", "y"), "a prompt"]
    return run_validation(
        tiny_model("llama", num_hidden_layers=4),
        CharTokenizer(),
        prompts,
        methods=["ig_lens", "random"],
        progress=False,
        study=StudyOptions(n_bootstrap=20, batch_size=2),
    )


@pytest.fixture(scope="session")
def batch_dir(tmp_path_factory):
    from captum_iglens.studies.batch import run_batch

    prompts = [
        {"id": "a", "prompt": "w5 w9 w13", "answer": "w20 w21 w22"},
        {"id": "b", "prompt": "w40 w41", "answer": "w60"},
        {"id": "c", "prompt": "w7", "answer": "w8 w9 w10 w11"},
    ]
    out = tmp_path_factory.mktemp("batch")
    run_batch(tiny_model("llama"), word_tokenizer(VOCAB), prompts, out, progress=False)
    return out


@pytest.fixture(scope="session")
def restoration_result():
    """The restoration study on a tiny Llama: four facts whose subject a test
    pattern finds, traced under both corruptions."""
    from captum_iglens.studies.validation import Fact, StudyOptions, run_restoration
    from captum_iglens.studies.validation import facts as facts_module

    prompts = ["w4 w10 w11 w5 w6", "w4 w20 w21 w5 w6", "w4 w30 w5 w6", "w4 w40 w5 w6"]
    facts = [Fact(f"t{i}", "tiny", p, answer=f"a{i}") for i, p in enumerate(prompts)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(
            facts_module.SUBJECT_PATTERNS, "tiny", r"^w4 (?P<subject>.+) w5 w6$"
        )
        return run_restoration(
            tiny_model("llama", num_hidden_layers=4),
            word_tokenizer(VOCAB),
            facts,
            methods=("ig_lens", "random"),
            study=StudyOptions(
                n_bootstrap=20, batch_size=3, min_effect=1e-9, noise_seeds=2
            ),
            progress=False,
        )


@pytest.fixture(scope="session")
def learned_result():
    """A map under random translators (a learned readout per layer)."""
    from captum_iglens import LayerIGLens
    from captum_iglens.readout.translators import Translators

    torch.manual_seed(0)
    model = tiny_model("llama")
    d, n = model.config.hidden_size, model.config.num_hidden_layers
    lens = Translators(0.3 * torch.randn(n, d, d), 0.3 * torch.randn(n, d))
    result = LayerIGLens.from_model(model, lens=lens).attribute_map(
        torch.randint(0, VOCAB, (1, 5))
    )
    assert result.lens_change is not None and result.lens_change.abs().max() > 1e-3
    return result


@pytest.fixture(scope="session")
def tiny_flow_graph():
    """The probability flow of a tiny Llama (grouped key-value heads), queries,
    keys and values separate, split by sender and receiver position."""
    from captum_iglens.attr.flow import ProbabilityFlow

    ids = torch.tensor([[1, 5, 9, 17, 33, 7, 40]])
    other = torch.tensor([[1, 5, 10, 18, 33, 7, 41]])
    return ProbabilityFlow(tiny_model("llama")).attribute(
        ids, counterfactual=other, n_steps=2, qkv=True, receiver_positions=True
    )


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium through Debian's chromedriver (the browser tests
    skip where it is not installed)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,900",
    ):
        options.add_argument(arg)
    options.set_capability(
        "goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"}
    )
    # An explicit driver: Selenium Manager never looks for (or downloads) one.
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()
