"""Data-parallel wrappers are unwrapped like the other libraries' wrappers."""

from torch import nn

from captum_iglens.integrations import unwrap_model


def test_data_parallel_is_unwrapped(llama):
    assert unwrap_model(nn.DataParallel(llama)) is llama
    assert unwrap_model(llama) is llama
    plain = nn.Linear(2, 2)
    assert unwrap_model(plain) is plain
