"""The command-line tool, run end to end as a user would."""

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from captum_iglens import IGLensResult
from captum_iglens.cli import build_parser, main
from tests.helpers import word_tokenizer

PROMPT = "What is the capital of Vietnam?"


def _run(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "captum_iglens", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )


@pytest.mark.real_model
def test_main_job_end_to_end(tmp_path):
    out = _run(
        PROMPT,
        "--max-new-tokens",
        "6",
        "--json",
        str(tmp_path / "r.json"),
        "--csv",
        str(tmp_path / "r.csv"),
        "--png",
        str(tmp_path / "r.png"),
        "--html",
        str(tmp_path / "r.html"),
    )
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert re.search(r"^token\s+L", out.stdout, re.M)
    residual = float(re.search(r"max \|Σ - Δp\| = ([0-9.e+-]+)", out.stdout).group(1))
    assert residual <= 1e-6
    result = IGLensResult.load(tmp_path / "r.json")
    change = result.model_prob - result.base_prob
    assert (result.total - change).abs().max() <= 1e-6
    assert result.metadata["prompt"] == PROMPT and result.metadata["versions"]["torch"]
    with open(tmp_path / "r.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == result.attributions.numel()
    by_token = {}
    for row in rows:
        by_token.setdefault(row["position"], 0.0)
        by_token[row["position"]] += float(row["credit"])
    assert torch.allclose(
        torch.tensor(list(by_token.values())), result.total[0], atol=1e-6
    )
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "r.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "iglens-data" in page


@pytest.mark.real_model
def test_stdin_layers_and_prompt_positions():
    out = _run(
        "--stdin",
        "--layers",
        "0,15",
        "--positions",
        "prompt",
        "--no-chat",
        stdin="Paris is the capital of",
    )
    assert out.returncode == 0, out.stderr
    header = next(line for line in out.stdout.splitlines() if line.startswith("token"))
    assert re.findall(r"\bL\d+", header) == ["L0", "L15", "L29"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["   "], "prompt"),
        ([PROMPT, "--model", "/no/such/model"], "/no/such/model"),
        # These two load the default model, then refuse.
        pytest.param(
            [PROMPT, "--layers", "0,99", "--max-new-tokens", "2"],
            "layers",
            marks=pytest.mark.real_model,
        ),
        ([PROMPT, "--n-steps", "0", "--max-new-tokens", "2"], "--n-steps:"),
        pytest.param(
            [PROMPT, "--layers", "0,1", "--granularity", "head"],
            "consecutive",
            marks=pytest.mark.real_model,
        ),
    ],
)
def test_bad_input_exits_with_one_line(args, message, capsys):
    try:
        status = main(args)
    except SystemExit as exit:  # argparse's own usage errors
        status = exit.code
    err = capsys.readouterr().err
    assert status == 2
    lines = err.strip().splitlines()
    assert lines[-1].startswith("captum-iglens: error:") and message in lines[-1]
    assert "Traceback" not in err


def test_unrecognised_readout_is_a_clean_error(tmp_path, capsys, monkeypatch):
    from transformers import AutoModelForCausalLM, GPTBigCodeConfig

    from captum_iglens.hf import architectures

    # GPTBigCode is not in the table; with a probe that proposes nothing, it
    # cannot be read out.
    monkeypatch.setattr(architectures, "propose_parts", lambda model: [])

    # Token ids inside the vocabulary: transformers would otherwise log a warning
    # through a handler bound to an earlier test's captured stderr.
    config = GPTBigCodeConfig(
        vocab_size=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=64,
        bos_token_id=1,
        eos_token_id=2,
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    word_tokenizer(64).save_pretrained(tmp_path)
    status = main(
        ["w5 w6 w7", "--model", str(tmp_path), "--no-chat", "--max-new-tokens", "2"]
    )
    err = capsys.readouterr().err
    assert status == 2 and "gpt_bigcode" in err and "Readout(" in err
    assert "Traceback" not in err


@pytest.mark.real_model
def test_batch_subcommand_writes_and_resumes(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        '{"id": "a", "prompt": "The capital of France is"}\n'
        '{"id": "b", "prompt": "Water is made of"}\n'
    )
    args = (
        "batch",
        str(prompts),
        "--out",
        str(tmp_path / "out"),
        "--no-chat",
        "--max-new-tokens",
        "3",
        "--layers",
        "10,20",
        "--html",
    )
    first = _run(*args)
    assert first.returncode == 0, first.stderr
    lines = (tmp_path / "out" / "results.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["a", "b"]
    for line in lines:
        result = IGLensResult.from_dict(
            {
                k: v
                for k, v in json.loads(line).items()
                if k not in ("id", "prompt", "answer")
            }
        )
        assert result.layer_names == ["10", "20", "29"]
        assert (
            result.total - (result.model_prob - result.base_prob)
        ).abs().max() <= 1e-6
    assert "iglens-data" in (tmp_path / "out" / "index.html").read_text()
    again = _run(*args)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "out" / "results.jsonl").read_text().splitlines() == lines


@pytest.mark.real_model
def test_validate_subcommand(tmp_path):
    out = _run(
        "validate",
        "--limit",
        "3",
        "--methods",
        "ig_lens,random",
        "--json",
        str(tmp_path / "v.json"),
        "--png",
        str(tmp_path / "v.png"),
    )
    assert out.returncode == 0, out.stderr
    assert re.search(r"^ig_lens\s+3\s+[+-]\d", out.stdout, re.M)
    data = json.loads((tmp_path / "v.json").read_text())
    assert data["mode"] == "skip"
    assert (tmp_path / "v.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.real_model
def test_validate_restoration_on_gemma3(tmp_path):
    out = _run(
        "validate",
        "--test",
        "restoration",
        "--model",
        "gemma3",
        "--limit",
        "2",
        "--methods",
        "ig_lens,random",
        "--json",
        str(tmp_path / "r.json"),
        "--png",
        str(tmp_path / "r.png"),
    )
    assert out.returncode == 0, out.stderr
    assert "restoration at the attributed position (18 blocks" in out.stdout
    assert re.search(r"^ig_lens\s+\d+\s+", out.stdout, re.M)
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["corruptions"] == ["noise", "counterfactual"]
    assert len(data["facts"]) == 2
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.real_model
def test_validate_and_compare_on_the_joint_path(tmp_path):
    """--path joint makes the main IG-Lens method itself the joint one, beside
    ig_lens_joint (the same map), in both studies."""
    out = _run(
        "validate",
        "--test",
        "restoration",
        "--path",
        "joint",
        "--limit",
        "2",
        "--noise-seeds",
        "1",
        "--methods",
        "ig_lens,ig_lens_joint,dla",
        "--json",
        str(tmp_path / "r.json"),
    )
    assert out.returncode == 0, out.stderr
    assert re.search(r"^ig_lens_joint\s+positive\s+", out.stdout, re.M)
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["settings"]["settings"]["path"] == "joint"
    assert data["scores"]["ig_lens"] == data["scores"]["ig_lens_joint"]
    out = _run(
        "compare",
        "The capital of France is",
        "--no-chat",
        "--path",
        "joint",
        "--methods",
        "ig_lens,ig_lens_joint,dla,dla_prob",
        "--json",
        str(tmp_path / "c.json"),
    )
    assert out.returncode == 0, out.stderr
    assert "joint path beside DLA over 4 columns" in out.stdout
    methods = json.loads((tmp_path / "c.json").read_text())["methods"]
    assert methods["ig_lens"]["scores"] == methods["ig_lens_joint"]["scores"]
    assert max(methods["ig_lens_joint"]["residual"][0]) <= 1e-6


def test_each_subcommand_keeps_its_own_defaults():
    from captum_iglens.cli import build_parser

    parser = build_parser()
    attribute = parser.parse_args(["attribute", "x"])
    compare = parser.parse_args(["compare", "x"])
    validate = parser.parse_args(["validate"])
    batch = parser.parse_args(["batch", "p.jsonl", "--out", "o"])
    # no --n-steps: the path's own default
    assert (attribute.n_steps, attribute.chat, attribute.max_new_tokens) == (
        None,
        True,
        32,
    )
    assert (compare.n_steps, compare.chat) == (8, True)
    assert (validate.chat, validate.max_new_tokens) == (False, 8)
    assert (batch.n_steps, batch.chat) == (None, True)
    for args in (compare, validate, batch):
        assert {"baselines", "method", "granularity", "positions", "layers"} <= set(
            vars(args)
        )


@pytest.mark.parametrize(
    "args, message",
    [
        (["x", "--json", "/no/such/dir/r.json"], "--json"),
        (["x", "--html", "/no/such/dir/r.html"], "--html"),
        (["compare", "x", "--html", "/no/such/dir/c.html"], "--html"),
        (["validate", "--html", "/no/such/dir/v.html"], "--html"),
        (["x", "--baseline", "median"], "baseline"),
        (["batch", "/no/such/prompts.jsonl", "--out", "o"], "prompts"),
        (["validate", "--limit", "0"], "--limit"),
        (["compare", "x", "--methods", "ig_lens,nope"], "--methods"),
        (
            ["compare", "x", "--methods", "ig_lens_sources", "--layers", "0,10"],
            "--layers: ig_lens_sources needs consecutive blocks",
        ),
        (["x", "--max-new-tokens", "0"], "--max-new-tokens:"),
        (["x", "--baseline", "nan"], "--baseline: expected finite"),
        (["x", "--baseline=-inf"], "--baseline: expected finite"),
        (["x", "--layers", ""], "--layers"),
        (["x", "--layers", "0,,5"], "--layers"),
        (["x", "--stdin"], "not both"),
        (["x", "--device", "cuda:99"], "--device"),
        (["x", "--device", "nonsense"], "--device"),
        (["x", "--device", "meta"], "--device"),
        (["x", "--json", f"{__file__}/r.json"], "is a file, not a folder"),
        (["--quiet", "compare", "x", "--methods", "nope"], "--methods"),
        (["--device", "cpu", "validate", "--limit", "-1"], "--limit"),
        (["validate", "--test", "restoration", "--chat"], "use chat=False"),
        (
            ["validate", "--test", "restoration", "--methods", "logit_lens"],
            "restoration needs ig_lens",
        ),
        (
            ["validate", "--test", "restoration", "--granularity", "sublayer"],
            "granularity='block'",
        ),
        (
            ["validate", "--test", "restoration", "--granularity", "head"],
            "granularity='block'",
        ),
        (
            ["validate", "--test", "restoration", "--positions", "all"],
            "positions='answer'",
        ),
        (["validate", "--granularity", "head"], "granularity='block'"),
        (["validate", "--top-k", "3"], "--top-k: not used by validate"),
        (["validate", "--test", "restoration", "--mode", "mean"], "--mode: not used"),
        (
            ["validate", "--test", "restoration", "--max-new-tokens", "3"],
            "--max-new-tokens: not used",
        ),
        # Issue 35: checked from the model's and the lens's files before the load.
        (["x", "--model", "TINY", "--layers", "0,99"], "--layers: the model has 2"),
        (["x", "--model", "TINY", "--top-k", "100000"], "--top-k: expected at most"),
        (["x", "--lens", "LENS-shape"], "0.weight should have shape (32, 32)"),
        (["x", "--lens", "LENS-nan"], "1.weight (translator 1) holds NaN or inf"),
        (["x", "--lens", "LENS-inf"], "0.bias (translator 0) holds NaN or inf"),
        (["x", "--lens", "LENS-missing"], "keys missing or extra: ['1.weight']"),
        (["x", "--lens", "LENS-extra"], "keys missing or extra: ['2.weight']"),
        (["x", "--lens", "LENS-garbage"], "params.pt is not a readable checkpoint"),
        (["x", "--lens", "LENS-nobias"], '"bias": false but'),
        (["--stdin"], "prompt: not valid UTF-8"),
        (["x", "--max-chunk-mib", "-5"], "--max-chunk-mib: expected an int >= 1"),
        (["x", "--target-tokens", " Paris,"], "--target-tokens: expected comma"),
        (["compare", "x", "--methods", "ig_lens,"], "--methods: expected comma"),
        (["batch", "PROMPTS-utf8", "--out", "o"], "prompts.jsonl:2: not valid UTF-8"),
        (["validate", "--prompts", "PROMPTS-utf8"], "prompts.jsonl:2: not valid UTF"),
        (["validate", "--prompts", "PROMPTS-answer"], "[1]: 'answer' is empty"),
        # Two outputs on one path, for every subcommand that writes files.
        (["x", "--json", "r.out", "--csv", "./r.out"], "--csv: the same path as"),
        (["x", "--png", "r.out", "--html", "r.out"], "--html: the same path as --png"),
        (["compare", "x", "--json", "c", "--png", "c"], "--png: the same path as"),
        (["validate", "--html", "v", "--json", "v"], "--html: the same path as"),
        (["fit-lens", "--out", "L", "--json", "L"], "--json: the same path as --out"),
        (["fit-lens", "--png", "f", "--json", "f"], "--json: the same path as --png"),
        # Issue 48: an empty output path, refused as a folder is, everywhere.
        (["x", "--json", ""], "--json: the path is empty"),
        (["x", "--html", ""], "--html: the path is empty"),
        (["x", "--csv", ""], "--csv: the path is empty"),
        (["x", "--png", ""], "--png: the path is empty"),
        (["compare", "x", "--png", ""], "--png: the path is empty"),
        (["validate", "--json", ""], "--json: the path is empty"),
        (["fit-lens", "--out", ""], "--out: the path is empty"),
        (["fit-lens", "--json", ""], "--json: the path is empty"),
        (["batch", "PROMPTS-ok", "--out", ""], "--out: the path is empty"),
        # Issue 48: refused before the load, not after the work.
        (["x", "--png", "x.txt"], "--png: x.txt ends in .txt, expected a .png"),
        (["compare", "x", "--png", "c.svg"], "--png: c.svg ends in .svg"),
        (["x", "--model", "TINY", "--n-steps", "100000000"], "--n-steps: the 1000"),
        (
            ["x", "--model", "TINY", "--n-steps", "99999999999999999999"],
            "do not fit in --max-chunk-mib 256",
        ),
        (["x", "--n-steps", "0"], "--n-steps: expected an int >= 1, got '0'"),
        (["x", "--top-k", "-1"], "--top-k: expected an int >= 0, got '-1'"),
        (["x", "--lens", "foo"], "--lens: foo is not a folder; expected logit"),
        (["x", "--device", "gpu7"], "--device: expected a torch device"),
        (["x", "--device", "cuda:x"], "--device: expected a torch device"),
        (["x", "--model", "TINY", "--foil", "w7 w8"], "--foil: 'w7 w8' is 2 tokens"),
        (["x", "--device-map", "auto", "--device", "cpu"], "either --device or"),
        (
            ["x", "--baseline", "1e30", "--path", "joint", "--granularity", "head"],
            "--baseline: expected values under 1.84e+19 in size",
        ),
    ],
)
def test_input_errors_before_the_model_loads(
    args, message, capsys, monkeypatch, tmp_path, tiny_folder
):
    import captum_iglens.hf.models as models

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was checked")

    args = [_placeholder(a, tmp_path, tiny_folder) for a in args]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(models, "load_default", no_model)
    monkeypatch.setattr(models, "load_embedded", no_model)
    monkeypatch.setattr(models, "load_model", no_model)
    stdin = io.TextIOWrapper(io.BytesIO(b"w5 \xff w6"), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    try:
        status = main(args)
    except SystemExit as exit:  # argparse's own usage errors
        status = exit.code
    err = capsys.readouterr().err
    assert status == 2 and message in err.strip().splitlines()[-1]
    assert "Traceback" not in err


def test_usage_errors_answer_without_importing_torch(tmp_path, tiny_folder):
    # Issue 48: value errors, and those checked against the model's config and
    # tokenizer files, answer before torch (or transformers) is imported.
    cases = [
        ["x", "--n-steps", "0"],
        ["x", "--top-k", "-1"],
        ["x", "--json", str(tmp_path / "no" / "x.json")],
        ["x", "--json", ""],
        ["x", "--baseline", "nan"],
        ["x", "--lens", str(tmp_path / "no-lens")],
        ["x", "--png", "x.txt"],
        ["x", "--model", tiny_folder, "--layers", "999"],
        ["x", "--model", tiny_folder, "--device", "gpu7"],
        ["x", "--model", tiny_folder, "--top-k", "100000"],
        ["x", "--model", tiny_folder, "--foil", "w7 w8"],
        ["x", "--model", tiny_folder, "--n-steps", "100000000"],
    ]
    script = (
        "import json, sys\n"
        "from captum_iglens.cli import main\n"
        "for args in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        status = main(args)\n"
        "    except SystemExit as exit:\n"
        "        status = exit.code\n"
        "    assert status == 2, args\n"
        "heavy = {'torch', 'transformers', 'numpy'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, json.dumps(cases)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert len(out.stderr.strip().splitlines()) == len(cases)


def _placeholder(arg, tmp_path, tiny_folder):
    """``arg`` with a file the case needs written: TINY (a model folder), LENS-x
    (a lens folder with the fault x) or PROMPTS-x (a prompt file with the fault
    x)."""
    if arg == "TINY":
        return tiny_folder
    if arg.startswith("PROMPTS-"):
        path = tmp_path / "prompts.jsonl"
        second = {
            "utf8": b'{"id": 2, "prompt": "b\xff"}',
            "answer": b'{"id": 2, "prompt": "b", "answer": ""}',
            "ok": b'{"id": 2, "prompt": "b"}',
        }[arg[8:]]
        path.write_bytes(b'{"id": 1, "prompt": "a"}\n' + second + b"\n")
        return str(path)
    if not arg.startswith("LENS-"):
        return arg
    from captum_iglens.readout.translators import Translators

    fault, folder = arg[5:], tmp_path / "lens"
    Translators.identity(n_layers=2, d_model=32).save(folder)
    state = torch.load(folder / "params.pt", weights_only=True)
    config = json.loads((folder / "config.json").read_text())
    if fault == "shape":
        state["0.weight"] = torch.zeros(32, 31)
    elif fault == "nan":
        state["1.weight"][3, 4] = float("nan")
    elif fault == "inf":
        state["0.bias"][0] = float("inf")
    elif fault == "missing":
        del state["1.weight"]
    elif fault == "extra":
        state["2.weight"] = torch.zeros(32, 32)
    elif fault == "nobias":
        config["bias"] = False
    torch.save(state, folder / "params.pt")
    (folder / "config.json").write_text(json.dumps(config))
    if fault == "garbage":
        (folder / "params.pt").write_bytes(b"not a checkpoint")
    return str(folder)


def test_internal_errors_keep_their_traceback(tmp_path, monkeypatch):
    import captum_iglens.attr as attr
    from tests.tiny_models import tiny_model

    tiny_model("llama").save_pretrained(tmp_path)
    word_tokenizer(128).save_pretrained(tmp_path)

    def broken(*args, **kwargs):
        raise ValueError("an internal bug")

    monkeypatch.setattr(attr, "attribute_text", broken)
    with pytest.raises(ValueError, match="an internal bug"):
        main(["w5 w6", "--model", str(tmp_path), "--no-chat", "--max-new-tokens", "2"])


def test_batch_out_must_be_a_folder(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": 1, "prompt": "x"}\n', encoding="utf-8")
    assert main(["batch", str(prompts), "--out", str(prompts)]) == 2
    assert "--out" in capsys.readouterr().err


def test_ctrl_c_is_one_line_and_exit_130(capsys, monkeypatch):
    import captum_iglens.hf.models as models

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "load_embedded", interrupted)
    assert main(["x"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "captum-iglens: interrupted"


def test_usage_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["x", "--dtype", "float8"])
    err = capsys.readouterr().err.strip()
    assert exit.value.code == 2 and len(err.splitlines()) == 1 and "--dtype" in err


def _tiny_folder(tmp_path):
    from tests.tiny_models import tiny_model

    tiny_model("llama").save_pretrained(tmp_path)
    word_tokenizer(128).save_pretrained(tmp_path)
    return str(tmp_path)


def test_top_k_foil_and_target_tokens(tmp_path, capsys):
    folder = _tiny_folder(tmp_path / "model")
    base = ["w5 w6", "--model", folder, "--no-chat", "--max-new-tokens", "3"]
    out_json = str(tmp_path / "r.json")
    assert main([*base, "--top-k", "3", "--foil", "w7", "--json", out_json]) == 0
    printed = capsys.readouterr().out
    assert "what each layer predicts" in printed and "rank of the target" in printed
    result = IGLensResult.load(out_json)
    assert result.top_ids.shape[-1] == 3 and result.top_tokens is not None
    assert result.foils[..., 0].eq(7).all()
    assert (result.total - (result.model_prob - result.base_prob)).abs().max() <= 1e-6
    assert main([*base, "--target-tokens", "w9,w10", "--json", out_json]) == 0
    assert IGLensResult.load(out_json).target_sets[0, 0].tolist() == [9, 10]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--foil", "w7 w8"], "--foil: 'w7 w8' is 2 tokens"),
        (["--target-tokens", "w9,w9"], "--target-tokens: the same token twice"),
        (["--top-k", "-1"], "error: --top-k: expected an int >= 0"),
        (["--n-steps", "0"], "error: --n-steps: expected an int >= 1"),
        (["--foil", "zzz"], "--foil: 'zzz' is not in the vocabulary"),
        (["--target-tokens", "w9,zzz"], "--target-tokens: 'zzz' is not in the voc"),
    ],
)
def test_bad_scored_tokens_exit_2(tmp_path, capsys, extra, message):
    folder = _tiny_folder(tmp_path)
    try:
        status = main(["w5 w6", "--model", folder, "--no-chat", *extra])
    except SystemExit as exit:  # argparse's own usage errors
        status = exit.code
    err = capsys.readouterr().err
    assert status == 2 and message in err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "args, expected",
    [
        (["x"], "smollm2"),
        (["x", "--model", "gemma3"], "gemma3"),
        (["validate", "--test", "restoration", "--model", "gemma3"], "gemma3"),
        (["compare", "x", "--model", "smollm2"], "smollm2"),
        (["batch", "PROMPTS", "--out", "OUT", "--model", "gemma3"], "gemma3"),
    ],
)
def test_model_short_names_load_the_embedded_models(
    args, expected, monkeypatch, tmp_path
):
    import captum_iglens.hf.models as models

    class Loaded(Exception):
        pass

    def load_embedded(name, **kwargs):
        raise Loaded(name)

    monkeypatch.setattr(models, "load_embedded", load_embedded)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "The capital of France is"}\n')
    paths = {"PROMPTS": str(prompts), "OUT": str(tmp_path / "out")}
    with pytest.raises(Loaded) as loaded:
        main([paths.get(a, a) for a in args])
    assert str(loaded.value) == expected


@pytest.mark.slow
def test_validate_restoration_writes_its_viewer(tmp_path, capsys, monkeypatch):
    from captum_iglens.studies.validation import facts as facts_module
    from tests.tiny_models import VOCAB, tiny_model

    monkeypatch.setitem(
        facts_module.SUBJECT_PATTERNS, "tiny", r"^w4 (?P<subject>.+) w5 w6$"
    )
    tiny_model("llama", num_hidden_layers=4).save_pretrained(tmp_path)
    word_tokenizer(VOCAB).save_pretrained(tmp_path)
    prompts = tmp_path / "facts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": f"t{i}", "relation": "tiny", "prompt": p}) + "\n"
            for i, p in enumerate(["w4 w10 w11 w5 w6", "w4 w20 w21 w5 w6"])
        )
    )
    page = tmp_path / "r.html"
    status = main(
        [
            "validate",
            "--test",
            "restoration",
            "--model",
            str(tmp_path),
            "--prompts",
            str(prompts),
            "--methods",
            "ig_lens,random",
            "--html",
            str(page),
        ]
    )
    assert status == 0, capsys.readouterr().err
    assert "restoration at the attributed position (4 blocks" in capsys.readouterr().out
    from tests.viewer.test_html import page_data

    data = page_data(page.read_text(encoding="utf-8"))
    assert data["kind"] == "restoration" and len(data["facts"]) == 2


def test_validate_restoration_runs_the_flow_as_a_method(tmp_path, capsys, monkeypatch):
    """ig_lens_flow is one more --methods name of the restoration study: in
    its JSON (per corruption, every fact within --limit, every noise draw
    run), the page, the table and the cost line, from the study's own noise
    draws and counterfactual subjects."""
    from captum_iglens.studies.validation import RestorationResult
    from captum_iglens.studies.validation import facts as facts_module
    from tests.tiny_models import VOCAB, tiny_model
    from tests.viewer.test_html import page_data

    monkeypatch.setitem(
        facts_module.SUBJECT_PATTERNS, "tiny", r"^w4 (?P<subject>.+) w5 w6$"
    )
    tiny_model("llama", num_hidden_layers=4).save_pretrained(tmp_path)
    word_tokenizer(VOCAB).save_pretrained(tmp_path)
    prompts = tmp_path / "facts.jsonl"
    lines = ["w4 w10 w11 w5 w6", "w4 w20 w21 w5 w6", "w4 w30 w5 w6", "w4 w40 w5 w6"]
    prompts.write_text(
        "".join(
            json.dumps(
                {"id": f"t{i}", "relation": "tiny", "prompt": p, "answer": f"a{i}"}
            )
            + "\n"
            for i, p in enumerate(lines)
        )
    )
    out = {ext: tmp_path / f"r.{ext}" for ext in ("json", "html", "png")}
    status = main(
        ["validate", "--test", "restoration", "--model", str(tmp_path)]
        + ["--prompts", str(prompts), "--methods", "ig_lens,ig_lens_flow"]
        + ["--limit", "3", "--noise-seeds", "2"]
        + [f"--{ext}={path}" for ext, path in out.items()]
    )
    captured = capsys.readouterr()
    assert status == 0, captured.err
    result = RestorationResult.load(out["json"])
    assert result.methods == ["ig_lens", "ig_lens_flow"]
    assert "ig_lens_flow" not in result.scores  # scored per corruption
    onsets = result.traced_onsets
    # t2 has no counterfactual: t3 (its pair) is beyond --limit
    assert not np.isnan(onsets["noise"]["ig_lens_flow"]).any()
    assert np.isnan(onsets["counterfactual"]["ig_lens_flow"]).tolist() == [
        False,
        False,
        True,
    ]
    runs = result.settings["traced_runs"]["ig_lens_flow"]
    assert runs["noise"]["runs"] == 3 * 2 and runs["counterfactual"]["runs"] == 2
    shares = result.traced_shares["noise"]["ig_lens_flow"]
    assert np.allclose(shares[:, -1], 1.0, atol=1e-9)  # all of Δp after the last
    data = page_data(out["html"].read_text(encoding="utf-8"))
    assert "ig_lens_flow" in data["methods"]
    trace = data["facts"][0]["traces"]["counterfactual"]
    assert (
        trace["onsets"]["ig_lens_flow"] == onsets["counterfactual"]["ig_lens_flow"][0]
    )
    assert len(trace["shares"]["ig_lens_flow"]) == 4
    assert "ig_lens_flow" in data["summary"]["noise"]["all"]
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = captured.out
    assert re.search(r"^ig_lens_flow +\d", table, re.M)  # a row per corruption
    assert re.search(
        r"^  ig_lens_flow \(n_steps=16\): noise [\d.]+ s, 6 runs", table, re.M
    )


def test_validate_ablation_refuses_the_flow(capsys):
    status = main(["validate", "--methods", "ig_lens,ig_lens_flow"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1
    assert "--methods: ig_lens_flow" in err[0] and "--test restoration" in err[0]


def test_restoration_facts_without_subjects_refused_before_the_model_loads(
    tmp_path, capsys, monkeypatch
):
    import captum_iglens.hf.models as models

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the facts were checked")

    monkeypatch.setattr(models, "load_embedded", no_model)
    facts = tmp_path / "facts.jsonl"
    facts.write_text(
        json.dumps({"id": "a", "relation": "other", "prompt": "Hi", "answer": "x"})
        + "\n"
    )
    status = main(["validate", "--test", "restoration", "--prompts", str(facts)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1
    assert "facts whose subject can be found" in err[0]


@pytest.mark.parametrize("granularity", ["head", "sublayer"])
def test_views_per_column_from_attribute_and_batch(tmp_path, capsys, granularity):
    """--top-k with every granularity gives one view per column of the map
    (head + top-k crashed after the work, leaving batch an empty results file)."""
    folder = _tiny_folder(tmp_path / "model")
    common = [
        "--model",
        folder,
        "--no-chat",
        "--max-new-tokens",
        "2",
        "--granularity",
        granularity,
        "--top-k",
        "2",
    ]
    out_json = str(tmp_path / "r.json")
    assert main(["w5 w6", *common, "--json", out_json]) == 0
    result = IGLensResult.load(out_json)
    assert result.top_ids.shape[2] == len(result.layer_names)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "w5 w6"}\n')
    assert main(["batch", str(prompts), "--out", str(tmp_path / "o"), *common]) == 0
    lines = (tmp_path / "o" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 1
    capsys.readouterr()


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return _tiny_folder(tmp_path_factory.mktemp("model"))


def _combinations():
    from captum_iglens.attr.granularities import GRANULARITIES
    from captum_iglens.hf.text import POSITIONS

    extras = {
        "views-foil": ["--top-k", "2", "--foil", "w7"],
        "captum-rule": ["--method", "riemann_middle", "--n-steps", "2"],
    }
    for granularity in GRANULARITIES:
        for positions in POSITIONS:
            for name, extra in extras.items():
                yield pytest.param(
                    ["--granularity", granularity, "--positions", positions, *extra],
                    id=f"{granularity}-{positions}-{name}",
                )


@pytest.mark.parametrize("options", list(_combinations()))
def test_every_option_combination_works_or_is_refused_in_one_line(
    tiny_folder, tmp_path, capsys, options
):
    """The CLI's combinations of granularity, positions, views, contrastive
    targets and estimators: each runs to a result file that loads, or is an
    input error (one line, exit 2), never a traceback after the work."""
    out_json = str(tmp_path / "r.json")
    args = ["w5 w6", "--model", tiny_folder, "--no-chat", "--max-new-tokens", "2"]
    status = main([*args, *options, "--json", out_json])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if status == 2:
        lines = [line for line in err.strip().splitlines() if "warning" not in line]
        assert len(lines) == 1 and lines[0].startswith("captum-iglens: error:")
    else:
        assert status == 0
        result = IGLensResult.load(out_json)
        assert torch.isfinite(result.attributions).all()
        if "riemann_middle" not in options:  # prediction_aware is exact
            assert (result.delta.abs() <= 1e-5).all()


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["--help"],
        ["--n-steps", "x", "p"],
        ["validate", "-x"],
        *([name, "--help"] for name in ("attribute", "compare", "batch")),
        *([name, "--help"] for name in ("validate", "fit-lens", "shell")),
        *([option, "nope", "p"] for option in ("--method", "--granularity")),
        *([option, "nope", "p"] for option in ("--path", "--positions")),
        ["validate", "--mode", "nope"],
        ["graph", "--help"],
        ["graph", "p", "--receiver-positions", "--n-steps", "0"],
        ["graph", "p", "--pairs-csv", "p.csv"],
        ["graph", "p", "--counterfactual", " "],
        ["graph", "p", "--json", "same.json", "--csv", "same.json"],
    ],
)
def test_version_help_and_usage_errors_import_no_torch(args):
    # What makes them answer at once: neither torch nor transformers is imported,
    # even where the help or the check reads a registry's names.
    code = (
        "import sys\n"
        "from captum_iglens.cli import main\n"
        "try:\n"
        f"    main({args!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = [m for m in ('torch', 'transformers', 'captum') if m in sys.modules]\n"
        "print('heavy:', heavy, file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert done.stderr.strip().splitlines()[-1] == "heavy: []", done.stderr


def test_one_token_prompt_with_positions_prompt_is_refused_before_the_work(
    tiny_folder, capsys
):
    args = ["w5", "--model", tiny_folder, "--no-chat", "--positions", "prompt"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "captum-iglens: error: --positions: prompt attributes each prompt token "
        "after the first, and this prompt is one token; give a longer prompt or "
        "--positions answer"
    )


def test_each_warning_once_and_control_tokens_spelled_in_the_prompt(tiny_folder):
    # The tiny tokenizer has no chat template; "</s>" is its end-of-sequence token.
    out = _run("w5 </s> w6", "--model", tiny_folder, "--max-new-tokens", "2")
    assert out.returncode == 0, out.stderr
    warned = [line for line in out.stderr.splitlines() if "warning:" in line]
    assert len(warned) == 2, out.stderr
    assert "no chat template" in warned[0] or "no chat template" in warned[1]
    assert any("spells the control token(s) </s>" in line for line in warned)


def test_fit_lens_warns_below_two_tokens_per_dimension():
    from captum_iglens.cli.fit_lens import _warn_few_tokens

    class Config:
        hidden_size = 576

    with pytest.warns(UserWarning, match=r"--tokens 10 is below 2 .* = 1152\)"):
        _warn_few_tokens(10, Config())


def test_prompt_and_answer_lines_are_escaped_as_the_rows_are(tiny_folder, capsys):
    prompt = "w5 \x1b[31m\x00\u202e w6"
    args = [prompt, "--model", tiny_folder, "--no-chat", "--max-new-tokens", "2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "prompt: w5 \\x1b[31m\\x00\\u202e w6\n" in out
    assert not any(c in out for c in "\x1b\x00\u202e")


@pytest.mark.parametrize(
    "name", ["attribute", "compare", "batch", "validate", "fit-lens", "shell"]
)
def test_every_subcommand_help_shows_its_deferred_texts(name, capsys):
    with pytest.raises(SystemExit) as exit:
        main([name, "--help"])
    out = capsys.readouterr().out
    assert exit.value.code == 0 and out.startswith(f"usage: captum-iglens {name}")
    if name != "fit-lens":  # the registries' names, read when the help is shown
        assert "prediction_aware" in out and "'source_head'" in out
    else:
        assert "fitting tokens (default: 8192)" in out


@pytest.mark.parametrize("quiet", [False, True])
def test_the_first_runs_conversion_is_said_into_a_log_unless_quiet(
    monkeypatch, capsys, quiet
):
    """stderr is captured here, not a terminal: the conversion's line is still
    asked for (the bars are left out by the loader), and --quiet drops it."""
    from captum_iglens.cli.common import load_model_of

    asked = {}
    monkeypatch.setattr(
        "captum_iglens.hf.models.load_embedded",
        lambda name, **options: asked.update(options),
    )
    args = build_parser().parse_args(["graph", "p", *(["--quiet"] if quiet else [])])
    load_model_of(args)
    assert asked["progress"] is not quiet


@pytest.mark.parametrize("device", [None, "cpu"])
def test_outside_torchrun_the_device_stays_as_given_with_cuda(device, monkeypatch):
    from captum_iglens.cli.common import join_processes

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        "captum_iglens.studies.distributed.init_distributed",
        lambda: pytest.fail("joined a group outside torchrun"),
    )
    for world in (None, "1"):  # torchrun with one process is one process too
        if world is not None:
            monkeypatch.setenv("WORLD_SIZE", world)
        given = [] if device is None else ["--device", device]
        args = build_parser().parse_args(["graph", *given])
        join_processes(args)
        assert args.device == device


@pytest.mark.parametrize("cuda, given", [(True, None), (False, None), (False, "cpu")])
def test_under_torchrun_each_process_takes_its_gpu(cuda, given, monkeypatch):
    from captum_iglens.cli.common import join_processes

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    device = torch.device("cuda:1" if cuda else "cpu")
    monkeypatch.setattr(
        "captum_iglens.studies.distributed.init_distributed", lambda: device
    )
    args = build_parser().parse_args(
        ["graph", *([] if given is None else ["--device", given])]
    )
    join_processes(args)
    assert args.device == ("cuda:1" if cuda else given)


@pytest.mark.parametrize("option", [["--device", "cpu"], ["--device-map", "auto"]])
def test_under_torchrun_with_cuda_a_device_is_refused(option, monkeypatch):
    from captum_iglens.cli.common import CommandError, join_processes

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        "captum_iglens.studies.distributed.init_distributed",
        lambda: pytest.fail("joined a group before refusing"),
    )
    args = build_parser().parse_args(["graph", *option])
    with pytest.raises(CommandError, match=f"^{option[0]}: under torchrun each"):
        join_processes(args)
