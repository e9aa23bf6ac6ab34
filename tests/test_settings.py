"""Settings: checked on construction, replaced, serialised, resolved with options."""

import pytest

from captum_iglens import Settings


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("layers", "0,1", TypeError),
        ("layers", [], ValueError),
        ("layers", [True], ValueError),
        ("layers", [0.5], ValueError),
        ("positions", "middle", ValueError),
        ("baselines", "median", TypeError),
        ("baselines", [0.0], TypeError),
        ("method", "simpson", ValueError),
        ("n_steps", 0, ValueError),
        ("n_steps", 2.0, ValueError),
        ("granularity", "neurons", ValueError),
        ("internal_batch_size", 0, ValueError),
        ("max_chunk_bytes", 0, ValueError),
        ("max_new_tokens", True, ValueError),
        ("chat", "yes", TypeError),
    ],
)
def test_bad_field_is_named(field, value, error):
    with pytest.raises(error, match=field if field != "baselines" else "baselines"):
        Settings(**{field: value})


def test_riemann_needs_two_steps():
    Settings(method="riemann_left", n_steps=2)
    with pytest.raises(ValueError, match="n_steps"):
        Settings(method="riemann_left", n_steps=1)


def test_layers_become_a_tuple_and_replace_checks_again():
    settings = Settings(layers=[3, 1])
    assert settings.layers == (3, 1)
    assert settings.replace(n_steps=7).n_steps == 7
    with pytest.raises(ValueError, match="n_steps"):
        settings.replace(n_steps=-1)
    with pytest.raises(TypeError, match="nsteps: not a setting"):
        settings.replace(nsteps=7)


def test_dict_round_trip_and_unknown_fields():
    settings = Settings(layers=(0, 5), baselines="mean", granularity="sublayer")
    # the record holds the steps taken (the path's default where none was set)
    resolved = settings.replace(n_steps=50, method="prediction_aware")
    assert Settings.from_dict(settings.to_dict()) == resolved
    joint = Settings(path="joint", granularity="head", n_steps=9)
    assert Settings.from_dict(joint.to_dict()) == joint.replace(method="adaptive")
    with pytest.raises(ValueError, match="unknown field"):
        Settings.from_dict({**settings.to_dict(), "colour": "red"})


def test_resolve_applies_options_over_settings():
    base = Settings(method="riemann_trapezoid", n_steps=4)
    assert Settings.resolve(None, {}) == Settings()
    assert Settings.resolve(base, {}) is base
    assert Settings.resolve(base, {"n_steps": 9}) == base.replace(n_steps=9)
    with pytest.raises(TypeError, match="settings"):
        Settings.resolve({"n_steps": 9}, {})


def test_top_k_setting_reaches_the_map():
    assert Settings(top_k=5).map_kwargs()["top_k"] == 5
    assert Settings().map_kwargs()["top_k"] == 0
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="top_k: expected an int >= 0"):
            Settings(top_k=bad)
