"""plot_heatmap and plot_trajectory: what is drawn equals what was computed."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from captum_iglens import IGLensResult, LayerIGLens  # noqa: E402
from captum_iglens.plots import (  # noqa: E402
    DOWN_COLOR,
    UP_COLOR,
    plot_heatmap,
    plot_trajectory,
)
from tests.helpers import left_padded  # noqa: E402
from tests.tiny_models import VOCAB, tiny_model  # noqa: E402

TOKENS = ["\n", " Paris", "ing", " ", "\t", "France", "'s"]


@pytest.fixture(scope="module")
def result():
    """A real IG-Lens map of a left-padded batch (sequence 1: 3 padding positions)."""
    model = tiny_model("llama", num_hidden_layers=4)
    lens = LayerIGLens.from_model(model)
    torch.manual_seed(0)
    ids, mask = left_padded([7, 4], VOCAB)
    res = lens.attribute_map(ids, additional_forward_args=(mask,))
    res.tokens = [list(TOKENS), list(TOKENS)]
    assert not res.mask[1, :3].any() and res.mask[1, 3:].all()
    return res


def _synthetic(b=1, p=3, k=4, seed=0, tokens=None):
    g = torch.Generator().manual_seed(seed)
    # Steps of at most 0.01 from a base in [0.4, 0.5]: levels stay probabilities.
    attributions = (torch.rand(b, p, k, generator=g) - 0.5) * 0.02
    base = 0.4 + torch.rand(b, p, generator=g) * 0.1
    lens = base[..., None] + attributions.cumsum(-1)
    return IGLensResult(
        attributions=attributions,
        levels=lens,
        base_prob=base,
        model_prob=lens[..., -1],
        delta=torch.zeros(b, p),
        targets=torch.arange(b * p).view(b, p) + 40,
        positions=torch.arange(p),
        mask=torch.ones(b, p, dtype=torch.bool),
        layer_names=[str(i) for i in range(k)],
        method="prediction_aware",
        n_steps=1,
        tokens=tokens,
    )


def _labels(ax, axis="y"):
    ticks = ax.get_yticklabels() if axis == "y" else ax.get_xticklabels()
    return [t.get_text() for t in ticks]


# ---------------------------------------------------------------- heatmap


@pytest.mark.parametrize("b", [0, 1, -1])
def test_heatmap_data_norm_and_labels(result, b):
    fig, ax = plot_heatmap(result, batch_index=b)
    try:
        assert isinstance(fig, Figure) and isinstance(ax, Axes)
        rows = result.mask[b].nonzero()[:, 0]
        expected = result.attributions[b, rows].numpy()
        image = ax.images[0]
        assert np.array_equal(np.asarray(image.get_array()), expected)
        # Diverging norm centred at 0, symmetric around the largest |credit|.
        vmax = np.abs(expected).max()
        assert image.norm.vmin == pytest.approx(-vmax)
        assert image.norm.vmax == pytest.approx(vmax)
        assert image.norm(0.0) == pytest.approx(0.5)
        # Rows: the non-padding tokens only, readable (whitespace escaped).
        labels = _labels(ax)
        assert len(labels) == len(rows)
        for label, p in zip(labels, rows.tolist()):
            assert repr(TOKENS[p]) in label
            assert "\n" not in label and "\t" not in label
        assert _labels(ax, "x") == result.layer_names
        bar_labels = [a.get_ylabel() for a in fig.axes if a is not ax]
        assert "credit (Δ probability)" in bar_labels
    finally:
        plt.close(fig)


@pytest.mark.parametrize("frac", [0.5, 0.9])
def test_heatmap_onset_boxes_at_onset_cells(result, frac):
    fig, ax = plot_heatmap(result, batch_index=1, onset_frac=frac)
    try:
        rows = result.mask[1].nonzero()[:, 0]
        onset = result.onset(frac)[1, rows].tolist()
        boxes = [p for p in ax.patches if p.get_gid() == "onset"]
        cells = sorted((round(p.get_y() + 0.5), round(p.get_x() + 0.5)) for p in boxes)
        assert cells == sorted((i, j) for i, j in enumerate(onset) if j >= 0)
        assert all(p.get_width() == 1.0 and p.get_height() == 1.0 for p in boxes)
    finally:
        plt.close(fig)
    fig, ax = plot_heatmap(result, annotate_onset=False)
    try:
        assert not [p for p in ax.patches if p.get_gid() == "onset"]
    finally:
        plt.close(fig)


def test_heatmap_without_tokens_uses_target_ids():
    res = _synthetic(p=3)
    fig, ax = plot_heatmap(res)
    try:
        for label, target in zip(_labels(ax), res.targets[0].tolist()):
            assert f"id {target}" in label
    finally:
        plt.close(fig)


def test_heatmap_all_zero_credit_has_a_valid_norm():
    res = _synthetic()
    res.attributions.zero_()
    fig, ax = plot_heatmap(res)
    try:
        norm = ax.images[0].norm
        assert norm.vmin == -norm.vmax and norm.vmax > 0
        assert not [p for p in ax.patches if p.get_gid() == "onset"]  # no onset
    finally:
        plt.close(fig)


def test_heatmap_figure_scales_with_grid():
    small_fig, _ = plot_heatmap(_synthetic(p=3, k=4))
    big_fig, _ = plot_heatmap(_synthetic(p=20, k=30))
    try:
        small, big = small_fig.get_size_inches(), big_fig.get_size_inches()
        assert big[0] > small[0] and big[1] > small[1]
        # 30 layers x 20 tokens: at least ~0.3 inch per cell.
        assert big[0] >= 30 * 0.3 and big[1] >= 20 * 0.3
    finally:
        plt.close(small_fig)
        plt.close(big_fig)


def test_long_maps_are_drawn_a_page_at_a_time():
    long = _synthetic(p=1500, k=4)
    fig, ax = plot_heatmap(long, annotate_onset=False)
    try:
        assert fig.get_size_inches()[1] < 40
        assert "tokens 1–100 of 1500" in ax.get_title()
        np.testing.assert_array_equal(
            ax.images[0].get_array(), long.attributions[0, :100].numpy()
        )
    finally:
        plt.close(fig)
    fig, ax = plot_heatmap(long, start=1450, max_rows=100)
    try:
        assert "tokens 1451–1500 of 1500" in ax.get_title()
        np.testing.assert_array_equal(
            ax.images[0].get_array(), long.attributions[0, 1450:].numpy()
        )
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match="start"):
        plot_heatmap(long, start=1500)


def test_heatmap_on_given_axes_and_show(monkeypatch):
    fig, given = plt.subplots()
    try:
        out_fig, out_ax = plot_heatmap(_synthetic(), ax=given)
        assert out_ax is given and out_fig is fig
    finally:
        plt.close(fig)
    shown = []
    monkeypatch.setattr(plt, "show", lambda *a, **k: shown.append(True))
    assert plot_heatmap(_synthetic(), show=True) is None
    assert shown == [True]
    plt.close("all")


# ---------------------------------------------------------------- trajectory


@pytest.mark.parametrize("position", [0, 3, -1])
def test_trajectory_lines_bars_and_levels(result, position):
    b = 0
    fig, ax = plot_trajectory(result, position, batch_index=b)
    try:
        assert isinstance(fig, Figure) and isinstance(ax, Axes)
        p = position % result.positions.numel()
        lines = {line.get_label(): line for line in ax.lines}
        credits = result.attributions[b, p].double().numpy()
        base = float(result.base_prob[b, p])
        cumulative = base + np.cumsum(credits)
        lens_line = lines["logit lens"]
        assert np.allclose(lens_line.get_ydata(), result.levels[b, p].numpy(), atol=0)
        assert np.array_equal(lens_line.get_xdata(), np.arange(len(credits)))
        cum_line = lines["cumulative credit"]
        assert np.allclose(cum_line.get_ydata(), cumulative, atol=1e-12)
        # Exact estimator: the two coincide, so one is a line, the other markers.
        assert np.allclose(cum_line.get_ydata(), lens_line.get_ydata(), atol=1e-6)
        assert cum_line.get_linestyle() == "None" and lens_line.get_linestyle() == "-"
        # Waterfall: each bar spans the credit, from the level before the layer.
        bars = ax.containers[0].patches
        assert np.allclose([r.get_height() for r in bars], credits, atol=1e-12)
        before = np.concatenate([[base], cumulative[:-1]])
        assert np.allclose([r.get_y() for r in bars], before, atol=1e-12)
        colors = [to_hex(r.get_facecolor(), keep_alpha=False) for r in bars]
        assert colors == [UP_COLOR if c >= 0 else DOWN_COLOR for c in credits]
        model_line = next(v for k, v in lines.items() if k.startswith("model p"))
        assert np.allclose(model_line.get_ydata(), float(result.model_prob[b, p]))
        onset_line = next(v for k, v in lines.items() if k.startswith("onset"))
        assert np.allclose(onset_line.get_xdata(), int(result.onset()[b, p]))
        assert repr(TOKENS[p]) in ax.get_title()
        assert _labels(ax, "x") == ["base", *result.layer_names]
    finally:
        plt.close(fig)


def test_trajectory_shows_both_signs():
    res = _synthetic(p=1, k=4)
    res.attributions[0, 0] = torch.tensor([0.2, -0.1, 0.3, -0.05])
    fig, ax = plot_trajectory(res, 0)
    try:
        bars = ax.containers[0].patches
        colors = [to_hex(r.get_facecolor(), keep_alpha=False) for r in bars]
        assert colors == [UP_COLOR, DOWN_COLOR, UP_COLOR, DOWN_COLOR]
        low, high = ax.get_ylim()
        cumulative = float(res.base_prob[0, 0]) + np.cumsum([0.2, -0.1, 0.3, -0.05])
        assert low <= 0.0 and high > cumulative.max()
    finally:
        plt.close(fig)


def test_trajectory_on_given_axes_and_show(monkeypatch):
    fig, given = plt.subplots()
    try:
        out_fig, out_ax = plot_trajectory(_synthetic(), 1, ax=given)
        assert out_ax is given and out_fig is fig
    finally:
        plt.close(fig)
    shown = []
    monkeypatch.setattr(plt, "show", lambda *a, **k: shown.append(True))
    assert plot_trajectory(_synthetic(), 0, show=True) is None
    assert shown == [True]
    plt.close("all")


# ---------------------------------------------------------------- errors


def test_bad_arguments(result):
    n_pos = result.positions.numel()
    for bad in (n_pos, -n_pos - 1, 1.0, True):
        with pytest.raises(ValueError, match="position"):
            plot_trajectory(result, bad)
    with pytest.raises(ValueError, match="position"):
        plot_trajectory(result, 0, batch_index=1)  # padding in sequence 1
    for bad in (2, -3, True):
        with pytest.raises(ValueError, match="batch_index"):
            plot_heatmap(result, batch_index=bad)
        with pytest.raises(ValueError, match="batch_index"):
            plot_trajectory(result, 0, batch_index=bad)
    for frac in (0.0, 1.5):
        with pytest.raises(ValueError, match="onset_frac"):
            plot_heatmap(result, onset_frac=frac)
        with pytest.raises(ValueError, match="onset_frac"):
            plot_trajectory(result, -1, onset_frac=frac)
    with pytest.raises(TypeError, match="result"):
        plot_heatmap(result.to_dict())
    empty = _synthetic(p=3)
    empty.attributions = empty.attributions[:, :0]
    with pytest.raises(ValueError, match="result"):
        plot_heatmap(empty)
    with pytest.raises(ValueError, match="result"):
        plot_trajectory(empty, 0)
    padded = _synthetic(p=2)
    padded.mask[:] = False
    with pytest.raises(ValueError, match="result"):
        plot_heatmap(padded)
    assert not plt.get_fignums()  # nothing was left open by the failures


def test_heatmap_of_heads_labels_blocks_and_stays_bounded():
    model = tiny_model("llama", num_hidden_layers=12, num_attention_heads=4)
    lens = LayerIGLens.from_model(model)
    res = lens.attribute_map(torch.randint(1, VOCAB, (1, 5)), granularity="head")
    n = len(res.layer_names)
    assert n == 1 + 12 * 5
    fig, ax = plot_heatmap(res)
    try:
        assert fig.get_size_inches()[0] <= 24.0
        np.testing.assert_allclose(
            ax.images[0].get_array(), res.attributions[0].numpy(), atol=0
        )
        labels = [t.get_text() for t in ax.get_xticklabels()]
        assert labels == ["input", *[str(j) for j in range(12)]]
        # One separator line per block boundary.
        assert len(ax.lines) == 12
    finally:
        plt.close(fig)


def test_heatmap_writes_each_layers_top_token():
    lens = LayerIGLens.from_model(tiny_model("llama"))
    ids, mask = left_padded([5, 3], VOCAB)
    res = lens.attribute_map(ids, additional_forward_args=(mask,), top_k=2)
    res.top_tokens = [
        [[[f"w{i}" for i in layer] for layer in pos] for pos in seq]
        for seq in res.top_ids.tolist()
    ]
    _, ax = plot_heatmap(res, batch_index=1)
    texts = [t for t in ax.texts if t.get_gid() == "top1"]
    rows = res.mask[1].nonzero()[:, 0].tolist()
    assert len(texts) == len(rows) * len(res.layer_names)
    expected = [f"w{int(res.top_ids[1, p, j, 0])}" for p in rows for j in range(2)]
    assert [t.get_text() for t in texts] == expected
    bold = [t.get_fontweight() == "bold" for t in texts]
    assert bold == [int(res.rank[1, p, j]) == 1 for p in rows for j in range(2)]
    plt.close("all")
    _, ax = plot_heatmap(res, show_top=False)
    assert not [t for t in ax.texts if t.get_gid() == "top1"]
    plt.close("all")
    plain = lens.attribute_map(ids, additional_forward_args=(mask,))
    with pytest.raises(ValueError, match="show_top: the result has no views"):
        plot_heatmap(plain, show_top=True)
