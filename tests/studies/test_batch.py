"""Prompt sets: padded batches, JSON Lines output, resumption, two Gloo processes."""

import json
import re
import socket

import pytest
import torch
import torch.multiprocessing as mp

from captum_iglens import LayerIGLens, Settings
from captum_iglens.studies.batch import read_results, run_batch, to_result
from captum_iglens.studies.prompts import read_prompts
from captum_iglens.hf.checksum import weights_checksum
from captum_iglens.hf import encode_answer, encode_prompt, teacher_forcing
from tests.helpers import fixed_weights, word_tokenizer
from tests.tiny_models import VOCAB, tiny_model

TOL = 1e-6
FIELDS = ("attributions", "levels", "base_prob", "model_prob", "delta")

# Prompts of different lengths, given answers of different lengths (one empty), and
# generated answers.
PROMPTS = [
    {"id": "a", "prompt": "w5 w9 w13", "answer": "w20 w21 w22"},
    {"id": 7, "prompt": "w40 w41 w42 w43 w44 w45 w46", "answer": "w60"},
    {"id": "c", "prompt": "w7", "answer": "w8 w9 w10 w11 w12"},
    {"id": "d", "prompt": "w100 w101 w102 w103"},
    {"id": "e", "prompt": "w13 w4 w5 w6 w7", "answer": "w90 w91"},
    {"id": "7", "prompt": "w30 w31", "answer": "w32 w33 w34 w35"},
    {"id": "g", "prompt": "w50 w51 w52 w53 w54 w55"},
    {"id": "h", "prompt": "w70 w71", "answer": ""},
]


def _run(out_dir, **kwargs):
    return run_batch(
        tiny_model("llama"),
        word_tokenizer(VOCAB),
        PROMPTS,
        out_dir,
        batch_size=3,
        max_new_tokens=4,
        progress=False,
        **kwargs,
    )


@pytest.fixture(scope="module")
def single_run(tmp_path_factory):
    path = _run(tmp_path_factory.mktemp("single"))
    return path, read_results(path)


def test_records_equal_per_prompt_maps(single_run):
    path, records = single_run
    assert path.name == "results.jsonl"
    assert [r["id"] for r in records] == [p["id"] for p in PROMPTS]
    model, tokenizer = tiny_model("llama"), word_tokenizer(VOCAB)
    lens = LayerIGLens.from_model(model)
    attributed = 0
    for record, item in zip(records, PROMPTS):
        assert record["prompt"] == item["prompt"]
        if "answer" in item:
            assert record["answer"] == item["answer"]
        result = to_result(record)
        answer = result.targets[0]
        if answer.numel() == 0:
            assert record["answer"] == "" and result.attributions.shape == (1, 0, 2)
            continue
        attributed += 1
        ids, positions, targets = teacher_forcing(
            encode_prompt(tokenizer, item["prompt"]), answer
        )
        expected = lens.attribute_map(ids, target=targets, positions=positions)
        assert torch.equal(result.positions, positions)
        assert torch.equal(result.targets, targets)
        assert result.layer_names == expected.layer_names == record["layer_names"]
        assert record["tokens"] == [
            [tokenizer.decode([t]) for t in targets[0].tolist()]
        ]
        for name in FIELDS:
            torch.testing.assert_close(
                getattr(result, name), getattr(expected, name), atol=TOL, rtol=0
            )
    assert attributed >= 5


def test_layers_subset(tmp_path):
    path = _run(tmp_path, layers=[0])
    assert all(r["layer_names"] == ["0", "1"] for r in read_results(path))


def test_resume_after_interruption_redoes_nothing(single_run, tmp_path, monkeypatch):
    _, records = single_run
    lines = (single_run[0]).read_text().splitlines(keepends=True)
    # Interrupted while writing the fourth record: three complete lines and a half.
    (tmp_path / "run.json").write_text((single_run[0].parent / "run.json").read_text())
    (tmp_path / "results.jsonl").write_text(
        "".join(lines[:3]) + lines[3][: len(lines[3]) // 2]
    )
    assert [r["id"] for r in read_results(tmp_path / "results.jsonl")] == ["a", 7, "c"]
    attributed = []
    original = LayerIGLens.attribute_map

    def counting(self, inputs, *args, **kwargs):
        attributed.append(inputs.shape[0])
        return original(self, inputs, *args, **kwargs)

    monkeypatch.setattr(LayerIGLens, "attribute_map", counting)
    path = _run(tmp_path)
    assert sum(attributed) <= len(PROMPTS) - 3  # only the unfinished prompts
    assert path.read_text() == "".join(lines)
    attributed.clear()
    _run(tmp_path)  # everything is done
    assert attributed == [] and path.read_text() == "".join(lines)


def test_a_resume_removes_the_partial_files_a_killed_write_left(single_run, tmp_path):
    path, _ = single_run
    for name in ("run.json", "results.jsonl"):
        (tmp_path / name).write_text((path.parent / name).read_text())
    killed = [tmp_path / ".results.jsonl.0123456789abcdef", tmp_path / ".run.json.x"]
    for partial in killed:
        partial.write_text("{")
    _run(tmp_path)
    assert not killed[0].exists()  # write_atomic's: a dot, the name, 16 hex digits
    assert killed[1].exists()  # not one of them: the user's, left alone
    assert (tmp_path / "results.jsonl").read_text() == path.read_text()


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(lambda lines: "".join(lines[:3]), id="batch-boundary"),
        pytest.param(lambda lines: "".join(lines[:4]), id="mid-batch"),
        pytest.param(
            lambda lines: "".join(lines[:4]) + lines[4][: len(lines[4]) // 3],
            id="mid-line",
        ),
    ],
)
def test_a_resume_writes_byte_for_byte_the_uninterrupted_run(
    single_run, tmp_path, monkeypatch, cut
):
    # The padding of a batch moves a map's last digits (on real models), so
    # a resume must pad each prompt as the first run did: the same batches.
    from captum_iglens.studies.batch import run as run_module

    batches = []
    original = run_module.attribute_batch

    def spy(model, tokenizer, ig_lens, batch, settings):
        batches.append([p["id"] for p in batch])
        return original(model, tokenizer, ig_lens, batch, settings)

    monkeypatch.setattr(run_module, "attribute_batch", spy)
    path, _ = single_run
    whole = path.read_bytes()
    (tmp_path / "run.json").write_text((path.parent / "run.json").read_text())
    (tmp_path / "results.jsonl").write_text(cut(whole.decode().splitlines(True)))
    assert _run(tmp_path).read_bytes() == whole
    first_run = [[p["id"] for p in PROMPTS[i : i + 3]] for i in range(0, 8, 3)]
    assert batches and all(batch in first_run for batch in batches)


def test_run_json_records_the_batch_size_and_a_resume_under_another_is_refused(
    tmp_path,
):
    from captum_iglens.studies.batch import check_resume

    model, tokenizer = tiny_model("llama"), word_tokenizer(VOCAB)
    run_batch(model, tokenizer, PROMPTS[:2], tmp_path, progress=False, batch_size=2)
    assert json.loads((tmp_path / "run.json").read_text())["batch_size"] == 2
    before = (tmp_path / "results.jsonl").read_text()
    with pytest.raises(ValueError, match="batch size 2 .3 now.*--batch-size 2"):
        run_batch(model, tokenizer, PROMPTS, tmp_path, progress=False, batch_size=3)
    with pytest.raises(ValueError, match="batch size 2 .3 now"):
        check_resume(tmp_path, PROMPTS, Settings(), batch_size=3)
    check_resume(tmp_path, PROMPTS, Settings(), batch_size=2)
    assert (tmp_path / "results.jsonl").read_text() == before


def test_an_empty_answer_on_the_joint_path_records_the_path(tmp_path):
    # Issue 48: the empty map of an empty answer is on the run's path too.
    model, tokenizer = tiny_model("llama"), word_tokenizer(VOCAB)
    prompts = [{"id": 1, "prompt": "w5 w6", "answer": ""}]
    path = run_batch(model, tokenizer, prompts, tmp_path, progress=False, path="joint")
    (record,) = read_results(path)
    assert record["path"] == "joint"
    result = to_result(record)
    assert result.path == "joint" and result.attributions.shape[1] == 0


def test_resume_of_a_joint_folder_names_the_default_path_now(tmp_path):
    # Issue 48: the default path, not written in the settings, reads as itself.
    from captum_iglens.studies.batch import check_resume

    model, tokenizer = tiny_model("llama"), word_tokenizer(VOCAB)
    run_batch(model, tokenizer, PROMPTS[:1], tmp_path, progress=False, path="joint")
    with pytest.raises(ValueError, match="path: 'joint' then, 'telescoping' now"):
        check_resume(tmp_path, PROMPTS, Settings(), batch_size=8)


def test_a_run_json_without_a_batch_size_resumes_under_any(tmp_path):
    model, tokenizer = tiny_model("llama"), word_tokenizer(VOCAB)
    run_batch(model, tokenizer, PROMPTS[:2], tmp_path, progress=False, batch_size=2)
    run = json.loads((tmp_path / "run.json").read_text())
    del run["batch_size"]
    (tmp_path / "run.json").write_text(json.dumps(run))
    run_batch(model, tokenizer, PROMPTS[:3], tmp_path, progress=False, batch_size=3)
    records = read_results(tmp_path / "results.jsonl")
    assert [r["id"] for r in records] == ["a", 7, "c"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    import os

    from captum_iglens.studies.batch import init_distributed

    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    assert init_distributed() == torch.device("cpu")
    try:
        path = _run(out_dir)
        assert path.name == "results.jsonl" and path.exists()
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_processes_merge_to_the_single_process_output(single_run, tmp_path):
    mp.spawn(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl", "run.json"]
    merged = read_results(tmp_path / "results.jsonl")
    expected = single_run[1]
    assert [r["id"] for r in merged] == [r["id"] for r in expected]
    for got, want in zip(merged, expected):
        assert got.keys() == want.keys()
        for key, value in want.items():
            if key in FIELDS + ("lens",):  # levels, stored as "lens"
                torch.testing.assert_close(
                    torch.tensor(got[key]), torch.tensor(value), atol=TOL, rtol=0
                )
            else:
                assert got[key] == value, key


def test_read_prompts_and_bad_prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PROMPTS) + "\n\n")
    assert read_prompts(path) == PROMPTS
    path.write_text('{"id": 1, "prompt": "w5"}\nnot json\n')
    with pytest.raises(ValueError, match="p.jsonl:2"):
        read_prompts(path)
    for bad, message in (
        ([{"id": 1, "prompt": "w5"}, {"id": 1, "prompt": "w6"}], "duplicate id"),
        ([{"prompt": "w5"}], "'id'"),
        ([{"id": "x", "prompt": "  "}], "prompt"),
        ([{"id": "x", "prompt": "w5", "answer": 3}], "answer"),
    ):
        with pytest.raises(ValueError, match=message):
            run_batch(None, None, bad, tmp_path)
    with pytest.raises(ValueError, match="batch_size"):
        run_batch(None, None, PROMPTS, tmp_path, batch_size=0)


# ------------------------------------------------------------ settings and resume


@pytest.mark.parametrize(
    "options",
    [
        dict(method="riemann_trapezoid", n_steps=3),
        dict(baselines="mean"),
        dict(baselines=0.0),
        dict(granularity="sublayer"),
        dict(positions="prompt"),
        dict(positions="all"),
        dict(chat=False, max_new_tokens=2),
        dict(top_k=3),
    ],
)
def test_every_setting_reaches_the_attribution(tmp_path, monkeypatch, options):
    seen = []
    original = LayerIGLens.attribute_map

    def spy(self, inputs, *args, **kwargs):
        seen.append(kwargs)
        return original(self, inputs, *args, **kwargs)

    monkeypatch.setattr(LayerIGLens, "attribute_map", spy)
    model, tokenizer = tiny_model("llama"), word_tokenizer(VOCAB)
    prompts = [p for p in PROMPTS if p.get("answer")][:3]
    path = run_batch(
        model, tokenizer, prompts, tmp_path, progress=False, batch_size=2, **options
    )
    settings = Settings(**options)
    for kwargs in seen:
        for name, value in settings.map_kwargs().items():
            assert kwargs[name] == value, name
    for record, item in zip(read_results(path), prompts):
        result = to_result(record)
        assert result.method == settings.estimator and result.n_steps == settings.steps
        if settings.granularity == "sublayer":
            assert result.layer_names == ["0.attn", "0.mlp", "1.attn", "1.mlp"]
        ids, positions, targets = teacher_forcing(
            encode_prompt(tokenizer, item["prompt"], chat=settings.chat),
            encode_answer(tokenizer, item["answer"]),
            settings.positions,
        )
        assert torch.equal(result.positions, positions)
        assert torch.equal(result.targets, targets)
        if settings.top_k and positions.numel():
            first = int(result.top_ids[0, 0, 0, 0])
            assert result.top_ids.shape[-1] == settings.top_k
            assert result.top_tokens[0][0][0][0] == tokenizer.decode([first])
        if positions.numel() == 0:  # a one-token prompt has no prompt positions
            assert result.attributions.shape[1] == 0
            continue
        expected = LayerIGLens.from_model(model).attribute_map(
            ids, target=targets, positions=positions, **settings.map_kwargs()
        )
        torch.testing.assert_close(
            result.attributions, expected.attributions, atol=TOL, rtol=0
        )


@pytest.mark.parametrize(
    "change",
    [
        dict(layers=[0]),
        dict(chat=False),
        dict(method="riemann_left", n_steps=2),
        dict(path="joint"),
    ],
)
def test_resume_under_other_settings_is_refused(tmp_path, change):
    model, tokenizer = tiny_model("llama"), word_tokenizer(VOCAB)
    run_batch(model, tokenizer, PROMPTS[:2], tmp_path, progress=False)
    before = (tmp_path / "results.jsonl").read_text()
    with pytest.raises(ValueError, match="new --out folder"):
        run_batch(model, tokenizer, PROMPTS, tmp_path, progress=False, **change)
    assert (tmp_path / "results.jsonl").read_text() == before


def test_resume_with_another_model_is_refused(tmp_path):
    tokenizer = word_tokenizer(VOCAB)
    run_batch(tiny_model("llama"), tokenizer, PROMPTS[:2], tmp_path, progress=False)
    other = tiny_model("llama")
    with torch.no_grad():
        other.lm_head.weight[0, 0] += 1.0
    with pytest.raises(ValueError, match="weights checksum"):
        run_batch(other, tokenizer, PROMPTS, tmp_path, progress=False)


# The checksum that version 0.1.0 recorded in run.json as "weights_sha256" for
# the fixed-weight tiny Llama (its parameters, then its buffers).
WEIGHTS_SHA256_0_1 = "1d2b38eb9ee674ee8d55e594495103e668eb7a6c406daff1534ac81f9264bd42"


def _run_json_0_1(out_dir, model, weights_sha256):
    """A run.json as version 0.1.0 wrote it: no readout, the older checksum."""
    from captum_iglens.settings import provenance

    settings = Settings(max_new_tokens=2)
    run = {**provenance(model, settings), "weights_sha256": weights_sha256}
    (out_dir / "run.json").write_text(json.dumps(run, indent=1))


def test_a_run_json_written_by_0_1_still_resumes_and_refuses(tmp_path):
    model, tokenizer = fixed_weights(tiny_model("llama")), word_tokenizer(VOCAB)
    kwargs = dict(progress=False, max_new_tokens=2)
    _run_json_0_1(tmp_path, model, WEIGHTS_SHA256_0_1)
    run_batch(model, tokenizer, PROMPTS[:2], tmp_path, **kwargs)
    assert [r["id"] for r in read_results(tmp_path / "results.jsonl")] == ["a", 7]
    assert "weights_checksum" not in json.loads((tmp_path / "run.json").read_text())
    with torch.no_grad():
        model.lm_head.weight[0, 0] += 1.0
    with pytest.raises(
        ValueError, match=f"weights sha256 .'{WEIGHTS_SHA256_0_1}' then"
    ):
        run_batch(model, tokenizer, PROMPTS, tmp_path, **kwargs)


def test_cli_checks_a_run_json_written_by_0_1(tmp_path):
    from captum_iglens.studies.batch import check_model

    model = fixed_weights(tiny_model("llama"))
    _run_json_0_1(tmp_path, model, WEIGHTS_SHA256_0_1)
    check_model(tmp_path, model)
    _run_json_0_1(tmp_path, model, "0" * 64)
    with pytest.raises(ValueError, match="other weights sha256"):
        check_model(tmp_path, model)


def test_run_json_records_the_lens_cache_checksum(tmp_path):
    model = tiny_model("llama")
    run_batch(model, word_tokenizer(VOCAB), PROMPTS[:1], tmp_path, progress=False)
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["weights_checksum"] == weights_checksum(model)
    assert "weights_sha256" not in run


def test_resume_with_the_same_model_under_another_path_goes_on(tmp_path):
    # The model's name is its path as given: the weights decide, not the string.
    tokenizer = word_tokenizer(VOCAB)
    model = tiny_model("llama")
    model.config._name_or_path = "models/tiny"
    run_batch(model, tokenizer, PROMPTS[:2], tmp_path, progress=False)
    model.config._name_or_path = "/home/me/models/tiny"
    run_batch(model, tokenizer, PROMPTS[:3], tmp_path, progress=False)
    assert [r["id"] for r in read_results(tmp_path / "results.jsonl")] == ["a", 7, "c"]


def test_refusals_show_the_full_differing_values(tmp_path):
    tokenizer = word_tokenizer(VOCAB)
    model = tiny_model("llama")
    run_batch(model, tokenizer, PROMPTS[:1], tmp_path, progress=False)
    other = tiny_model("llama")
    with torch.no_grad():
        other.lm_head.weight[0, 0] += 1.0
    with pytest.raises(ValueError) as refused:
        run_batch(other, tokenizer, PROMPTS, tmp_path, progress=False)
    message = str(refused.value)
    assert weights_checksum(model) in message and weights_checksum(other) in message
    with pytest.raises(ValueError, match=r"method: 'prediction_aware' then, "):
        run_batch(
            model, tokenizer, PROMPTS, tmp_path, progress=False, method="riemann_left"
        )


@pytest.mark.parametrize(
    "change",
    [
        {"prompt": "w5 w9 w14"},  # the prompt of "a"
        {"answer": "w20 w21"},  # its given answer
        {"answer": None},  # its answer, now to be generated
    ],
)
def test_resume_with_changed_texts_names_the_ids(tmp_path, change):
    model, tokenizer = tiny_model("llama"), word_tokenizer(VOCAB)
    run_batch(model, tokenizer, PROMPTS[:3], tmp_path, progress=False, max_new_tokens=2)
    before = (tmp_path / "results.jsonl").read_text()
    edited = {**PROMPTS[0], **change}
    if edited["answer"] is None:
        del edited["answer"]
    with pytest.raises(ValueError, match=r"ids 'a' differs.*new ids"):
        run_batch(
            model,
            tokenizer,
            [edited, *PROMPTS[1:]],
            tmp_path,
            progress=False,
            max_new_tokens=2,
        )
    assert (tmp_path / "results.jsonl").read_text() == before


def _holder(out_dir, seconds):
    """Another process that takes the folder's lock and holds it."""
    import subprocess
    import sys

    code = (
        "import sys, time\n"
        "from captum_iglens.studies.batch import BatchLock\n"
        "BatchLock(sys.argv[1]).acquire()\n"
        "print('locked', flush=True)\n"
        "time.sleep(float(sys.argv[2]))\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(out_dir), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline().strip() == "locked"
    return process


@pytest.mark.slow
def test_a_second_run_on_a_locked_folder_is_refused(tmp_path):
    from captum_iglens.studies.batch import LOCK

    model, tokenizer = tiny_model("llama"), word_tokenizer(VOCAB)
    holder = _holder(tmp_path, 60)
    try:
        with pytest.raises(ValueError, match=f"another run \\(pid {holder.pid} on "):
            run_batch(model, tokenizer, PROMPTS[:2], tmp_path, progress=False)
        assert not (tmp_path / "results.jsonl").exists()
    finally:
        holder.kill()
        holder.wait()
    # Its process is gone: the lock is stale, taken over, and released at the end.
    assert (tmp_path / LOCK).exists()
    run_batch(model, tokenizer, PROMPTS[:2], tmp_path, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl", "run.json"]


@pytest.mark.slow
def test_cli_refuses_in_one_line_before_the_model_loads(tmp_path, capsys):
    from captum_iglens.cli import main

    model, tokenizer = tiny_model("llama"), word_tokenizer(VOCAB)
    run_batch(model, tokenizer, PROMPTS[:2], tmp_path / "out", progress=False)
    prompts = tmp_path / "p.jsonl"
    edited = [{**PROMPTS[0], "prompt": "w5 w9 w14"}, PROMPTS[1]]
    prompts.write_text("\n".join(json.dumps(p) for p in edited))
    # No such model: had the checks come after loading, the error would name it.
    base = ["batch", str(prompts), "--out", str(tmp_path / "out")]
    base += ["--model", str(tmp_path / "no-model")]
    cases = [
        (["--no-chat", "--max-new-tokens", "32"], r"settings \(chat: True then, False"),
        (["--max-new-tokens", "32"], "ids 'a' differs"),
    ]
    holder = _holder(tmp_path / "out", 60)
    try:
        assert main([*base, "--max-new-tokens", "32"]) == 2
        err = capsys.readouterr().err
        assert f"pid {holder.pid}" in err and len(err.splitlines()) == 1
    finally:
        holder.kill()
        holder.wait()
    for extra, message in cases:
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert re.search(message, err) and len(err.splitlines()) == 1, err
        assert "no-model" not in err


def test_cli_resume_knows_the_model_by_its_weights(tmp_path, capsys, monkeypatch):
    from captum_iglens.cli import main

    model = tiny_model("llama")
    model.save_pretrained(tmp_path / "model")
    word_tokenizer(VOCAB).save_pretrained(tmp_path / "model")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps(p) for p in PROMPTS[:2]))
    args = ["batch", str(prompts), "--out", str(tmp_path / "out"), "--no-chat"]
    args += ["--max-new-tokens", "2", "--quiet"]
    assert main([*args, "--model", str(tmp_path / "model")]) == 0
    monkeypatch.chdir(tmp_path)
    assert main([*args, "--model", "model"]) == 0  # the same folder, relatively
    recorded = json.loads((tmp_path / "out" / "run.json").read_text())
    with torch.no_grad():
        model.lm_head.weight[0, 0] += 1.0
    model.save_pretrained(tmp_path / "other")
    word_tokenizer(VOCAB).save_pretrained(tmp_path / "other")
    capsys.readouterr()
    assert main([*args, "--model", "other"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and recorded["weights_checksum"] in err
    assert "'other' now" in err


def _refused_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    import os

    from captum_iglens.studies.batch import init_distributed

    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    init_distributed()
    try:
        with pytest.raises(ValueError, match="another run"):
            _run(out_dir)  # rank 0 finds the lock; rank 1 hears it, no hang
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_a_locked_folder_stops_every_process(tmp_path):
    holder = _holder(tmp_path, 120)
    try:
        mp.spawn(
            _refused_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True
        )
    finally:
        holder.kill()
        holder.wait()
    assert not (tmp_path / "results.jsonl").exists()


def test_a_learned_readout_is_recorded_and_a_rerun_under_another_refused(tmp_path):
    from captum_iglens.readout.translators import Translators

    model = tiny_model("llama")
    d, n = model.config.hidden_size, model.config.num_hidden_layers
    torch.manual_seed(0)
    translators = Translators(0.3 * torch.randn(n, d, d), 0.3 * torch.randn(n, d))
    kwargs = dict(progress=False, max_new_tokens=2)
    path = run_batch(
        model, word_tokenizer(VOCAB), PROMPTS[:2], tmp_path, lens=translators, **kwargs
    )
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["readout"] == {"kind": "tuned", "checksum": translators.checksum()}
    for record in read_results(path):
        result = to_result(record)
        assert result.readout_checksum == translators.checksum()
        change = result.model_prob - result.base_prob
        parts = result.block_part.sum(-1) + result.lens_change.sum(-1)
        assert (parts - change).abs().max() <= 1e-6
    before = path.read_text()
    with pytest.raises(
        ValueError, match="other readout .*kind: 'tuned' then, 'logit' now"
    ):
        run_batch(model, word_tokenizer(VOCAB), PROMPTS, tmp_path, **kwargs)
    assert path.read_text() == before


def test_cli_resume_under_another_dtype_says_the_dtype_differs(tmp_path, capsys):
    from captum_iglens.cli import main

    tiny_model("llama").save_pretrained(tmp_path / "model")
    word_tokenizer(VOCAB).save_pretrained(tmp_path / "model")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps(p) for p in PROMPTS[:2]))
    args = ["batch", str(prompts), "--out", str(tmp_path / "out"), "--no-chat"]
    args += ["--max-new-tokens", "2", "--quiet", "--model", str(tmp_path / "model")]
    assert main(args) == 0
    capsys.readouterr()
    assert main([*args, "--dtype", "bfloat16"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert "the model in float32, this run has it in bfloat16" in err
    assert "--dtype float32" in err


@pytest.mark.slow
def test_under_torchrun_rank_0_alone_says_where_and_writes_the_page(
    tiny_folder, tmp_path
):
    import os
    import subprocess
    import sys
    from pathlib import Path

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"t{i} t6"}) + "\n" for i in (4, 5, 7))
    )
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", "-m", "captum_iglens", "batch"]
    command += [str(prompts), "--out", str(tmp_path / "out"), "--html"]
    command += ["--model", str(tiny_folder[0]), "--no-chat", "--max-new-tokens", "1"]
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("results: ") == 1 and done.stdout.count("viewer: ") == 1
    assert len(read_results(tmp_path / "out" / "results.jsonl")) == 3
