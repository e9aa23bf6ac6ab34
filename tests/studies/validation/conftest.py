import pytest

from tests.tiny_models import tiny_model


@pytest.fixture(scope="module")
def llama4():
    """A tiny Llama with four blocks."""
    return tiny_model("llama", num_hidden_layers=4)
