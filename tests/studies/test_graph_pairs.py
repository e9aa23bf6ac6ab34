"""``graph --pairs FILE --out DIR``: every row refused before the model loads,
a rerun under other options or weights refused, and the files of one
uninterrupted process written byte for byte by two torchrun processes and by
a run killed with SIGKILL and resumed. The subprocesses and the run they are
compared with compute with one CPU thread (the last bits of a float sum depend
on the thread count)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from captum_iglens.attr.flow.graph import FlowGraph
from captum_iglens.cli import main

ROOT = Path(__file__).resolve().parents[2]
# t4..t9 are words the saved tiny tokenizer keeps whole (see tiny_folder).
ROWS = [
    {"id": "a", "prompt": "t5 t6 t7 t8", "counterfactual": "t5 t9 t7 t8"},
    {"prompt": "t4 t5 t6", "corrupt_subject": "t5", "target": 20},
    None,  # a blank line: the rows keep their line numbers
    {"id": 7, "prompt": "t4 t5 t6 t7 t8 t9", "counterfactual": "t4 t5 t6 t7 t8 t4"},
    {"id": "d", "prompt": "t6 t7", "target": 30},
    {"id": "e", "prompt": "t9 t8 t7 t6 t5", "corrupt_subject": "t7 t6"},
]
OPTIONS = ["--n-steps", "3", "--qkv", "--quiet"]


def _pairs(path, rows=ROWS):
    path.write_text("\n".join("" if r is None else json.dumps(r) for r in rows))
    return path


def _argv(pairs, out, model):
    return ["graph", "--pairs", str(pairs), "--out", str(out), "--model", str(model)]


def _one_thread_main(argv):
    """``main`` computing with one CPU thread, as each subprocess here does."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return main(argv)
    finally:
        torch.set_num_threads(threads)


def _files(folder):
    """Every file under ``folder`` (dot files included) and its bytes."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def single(tiny_folder, tmp_path_factory):
    """One uninterrupted single-process run: its pair file, model and files."""
    folder = tmp_path_factory.mktemp("single")
    pairs, model = _pairs(folder / "pairs.jsonl"), tiny_folder[0]
    assert _one_thread_main([*_argv(pairs, folder / "out", model), *OPTIONS]) == 0
    return pairs, model, folder / "out", _files(folder / "out")


def test_one_file_a_row_named_by_id_or_line_and_a_run_record(single):
    _, _, out, files = single
    names = ["graphs/2.json", "graphs/7.json", "graphs/a.json", "graphs/d.json"]
    assert sorted(files) == [*names, "graphs/e.json", "run.json"]
    run = json.loads(files["run.json"])
    assert run["graph"]["n_steps"] == 3 and run["graph"]["qkv"] is True
    assert run["pairs"]["rows"] == 5 and run["arithmetic"] == "cpu, 1 thread"
    subject = FlowGraph.load(out / "graphs" / "2.json")
    assert subject.counterfactual["kind"] == "subject_noise"
    assert subject.settings["target"] == 20
    assert FlowGraph.load(out / "graphs" / "d.json").counterfactual == {"kind": "mean"}


def test_a_row_s_graph_is_the_graph_command_s(single, tmp_path, capsys):
    pairs, model, _, files = single
    for name, start in [("a", "--counterfactual"), ("e", "--corrupt-subject")]:
        (row,) = [r for r in ROWS if r and r.get("id") == name]
        value = row.get("counterfactual", row.get("corrupt_subject"))
        argv = ["graph", row["prompt"], start, value, "--model", str(model)]
        out = tmp_path / f"{name}.json"
        assert _one_thread_main([*argv, *OPTIONS, "--json", str(out)]) == 0
        assert out.read_bytes() == files[f"graphs/{name}.json"], name


@pytest.mark.slow
def test_two_torchrun_processes_write_the_files_of_one(single, tmp_path):
    pairs, model, _, files = single
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", "-m", "captum_iglens"]
    command += [*_argv(pairs, tmp_path / "out", model), *OPTIONS]
    done = subprocess.run(command, env=_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("graphs: ") == 1  # rank 0 says where they are
    assert _files(tmp_path / "out") == files


_KILLABLE = """
import os, sys, time
import captum_iglens._utils.serialization as serialization
from captum_iglens.cli import main

renames = []

def replace(partial, path):  # the second graph's write stops before its rename
    renames.append(path)
    if len(renames) == 3:  # run.json, the first graph, the second graph
        time.sleep(600)
    os.replace(partial, path)

serialization.os = type(sys)("os_stand_in")
serialization.os.__dict__.update(os.__dict__, replace=replace)
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_run_killed_with_sigkill_resumes_to_the_uninterrupted_files(
    single, tmp_path, capsys
):
    pairs, model, _, files = single
    out = tmp_path / "out"
    argv = [*_argv(pairs, out, model), *OPTIONS]
    process = subprocess.Popen(
        [sys.executable, "-c", _KILLABLE, *argv],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        # the first graph renamed, the second one's write stopped before its own
        while not (
            (out / "graphs" / "a.json").exists() and any((out / "graphs").glob(".*"))
        ):
            assert process.poll() is None, process.stderr.read().decode()
            assert time.monotonic() < deadline, "no write started"
            time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    left = _files(out)
    assert ".batch.lock" in left and len(left) == 4  # the lock, a partial file
    assert sum(name.endswith(".json") for name in left) == 2  # run.json, a graph
    assert _one_thread_main(argv) == 0  # the lock's process is gone: taken over
    assert _files(out) == files


def test_a_rerun_resumes_and_other_options_or_weights_are_refused(
    single, tmp_path, capsys, monkeypatch
):
    pairs, model, _, files = single
    out = tmp_path / "out"
    argv = [*_argv(pairs, out, model), *OPTIONS]
    for name, data in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    (out / "graphs" / "d.json").unlink()
    assert _one_thread_main(argv) == 0
    assert _files(out) == files
    capsys.readouterr()
    assert main([*argv, "--n-steps", "4"]) == 2  # before the model loads
    err = capsys.readouterr().err
    assert "--out: " in err and "(n_steps: 3 then, 4 now)" in err
    _pairs(pairs.parent / "other.jsonl", ROWS[:2])
    assert main([*argv[:2], str(pairs.parent / "other.jsonl"), *argv[3:]]) == 2
    assert "other pairs (checksum: " in capsys.readouterr().err
    changed = tmp_path / "copy" / Path(model).name  # the name the files record
    shutil.copytree(model, changed)
    weights = load_file(changed / "model.safetensors")
    weights[sorted(weights)[0]] += 1
    save_file(weights, changed / "model.safetensors", metadata={"format": "pt"})
    assert _one_thread_main([*argv[:6], str(changed), *argv[7:]]) == 2
    err = capsys.readouterr().err
    assert "other weights checksum" in err and len(err.splitlines()) == 1
    assert _files(out) == files


def _no_model(*args, **kwargs):
    raise AssertionError("the model was loaded")


@pytest.mark.parametrize(
    "lines, named",
    [
        (['{"prompt": "t5 t6"', ""], "p.jsonl:1: not a JSON object"),
        (['{"id": 1, "prompt": "t5"}', '{"id": "x"}'], "p.jsonl:2: missing field"),
        (['{"prompt": "  "}'], "p.jsonl:1: prompt: expected a non-empty string"),
        (['{"prompt": "t5", "cf": "t6"}'], "p.jsonl:1: unknown fields ['cf']"),
        (
            ['{"prompt": "t5 t6", "counterfactual": "t5 t7", "corrupt_subject": "t6"}'],
            "p.jsonl:1: give either counterfactual or corrupt_subject, not both",
        ),
        (
            ['{"id": "A", "prompt": "t5"}', "", '{"id": "a", "prompt": "t6"}'],
            "p.jsonl:3: duplicate id 'a': p.jsonl:1 has 'A'",
        ),
        (
            ['{"prompt": "t5"}', '{"id": "1", "prompt": "t6"}'],
            "p.jsonl:2: duplicate id '1': p.jsonl:1 has 1",
        ),
        (['{"id": "../x", "prompt": "t5"}'], "p.jsonl:1: id: '../x' cannot name"),
        (['{"prompt": "t5", "target": true}'], "p.jsonl:1: target: expected a token's"),
        (
            ['{"prompt": "t5 t6", "corrupt_subject": "t9"}'],
            "p.jsonl:1: corrupt_subject: 't9' is not in",
        ),
        (
            ['{"prompt": "t5 t6", "foil": "t7"}'],
            "p.jsonl:1: foil: --target-kind 'prob' takes no foil",
        ),
        ([b'{"prompt": "t5 \xff"}'], "p.jsonl:1: not valid UTF-8 (byte 0xff"),
        ([], "p.jsonl: no rows"),
    ],
)
def test_every_row_is_checked_before_the_model_loads(
    lines, named, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("captum_iglens.hf.models.load_model", _no_model)
    raw = [line if isinstance(line, bytes) else line.encode() for line in lines]
    Path("p.jsonl").write_bytes(b"\n".join(raw))
    assert main(["graph", "--pairs", "p.jsonl", "--out", "out", "--model", "m"]) == 2
    err = capsys.readouterr().err
    assert f"--pairs: {named}" in err and len(err.splitlines()) == 1, err
    assert not Path("out").exists()


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--pairs", "p.jsonl"], "--pairs: needs --out DIR"),
        (["t5", "--out", "out"], "--out: give --pairs FILE and --out DIR together"),
        (["t5", "--pairs", "p.jsonl", "--out", "out"], "--pairs: the prompts are"),
        (["--pairs", "p.jsonl", "--out", "out", "--json", "g.json"], "--json: writes"),
        (["--pairs", "p.jsonl", "--out", "."], "--out: . holds or lies in the run's"),
        (["--pairs", "p.jsonl", "--out", "m/out"], "--out: m/out holds or lies in"),
        (["--pairs", "no.jsonl", "--out", "out"], "--pairs: no.jsonl: no such file"),
        (["--pairs", "m", "--out", "out"], "--pairs: m: is a folder; expected a JSON"),
        (
            ["--pairs", "p.jsonl", "--out", "out", "--target-kind", "prob_diff"],
            "--pairs: p.jsonl:2: foil: --target-kind 'prob_diff' needs a foil",
        ),
        (
            ["--pairs", "p.jsonl", "--out", "out", "--corrupt-subject", "t5"],
            "--pairs: p.jsonl:2: corrupt_subject: 't5' is not in the prompt 't6'",
        ),
        (["--pairs", "p.jsonl", "--out", "old"], "--out: old holds graphs but no"),
    ],
)
def test_options_and_folders_are_checked_before_the_model_loads(
    argv, named, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("captum_iglens.hf.models.load_model", _no_model)
    rows = ['{"prompt": "t5 t6", "counterfactual": "t5 t7"}', '{"prompt": "t6"}']
    Path("p.jsonl").write_text("\n".join(rows))
    Path("m").mkdir()
    Path("m/config.json").write_text("{}")
    Path("old/graphs").mkdir(parents=True)
    Path("old/graphs/1.json").write_text("{}")
    assert main(["graph", *argv, "--model", "m"]) == 2
    err = capsys.readouterr().err
    assert named in err and len(err.splitlines()) == 1, err


def test_a_row_s_refusal_names_the_option_and_the_row(single, tmp_path, capsys):
    pairs, model, _, _ = single
    argv = [*_argv(pairs, tmp_path / "out", model), "--position", "99"]
    assert main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"--pairs: {pairs}:1: --position: " in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_null_id_is_absent_and_prompts_are_stripped_in_a_file_and_in_python(
    tmp_path,
):
    from captum_iglens.studies.pair_file import as_pairs, read_pairs

    rows = [
        {"id": None, "prompt": " t5 t6 ", "counterfactual": "t5 t7\n"},
        {"id": "b", "prompt": "t6"},
    ]
    from_file = read_pairs(_pairs(tmp_path / "p.jsonl", rows))
    in_python = as_pairs(rows)
    assert [p.id for p in from_file] == [1, "b"]
    assert [p.id for p in in_python] == [0, "b"]
    for pairs in (from_file, in_python):
        assert (pairs[0].prompt, pairs[0].counterfactual) == ("t5 t6", "t5 t7")


def test_graph_pairs_in_python_names_the_row(llama, tmp_path):
    from captum_iglens.studies.batch import graph_pairs
    from tests.tiny_models import tiny_tokenizer

    rows = [{"prompt": "t5 t6"}, {"prompt": "t5 t6", "counterfactual": "t5"}]
    with pytest.raises(ValueError, match=r"^pairs\[1\]: counterfactual: 2 tokens"):
        graph_pairs(llama, tiny_tokenizer(), rows, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
    folder = graph_pairs(
        llama, tiny_tokenizer(), rows[:1], tmp_path / "out", n_steps=2, keep=0.5
    )
    graph = FlowGraph.load(folder / "0.json")
    assert graph.settings["pruned"]["keep"] == 0.5


def test_a_resume_checksums_the_weights_once_and_removes_a_killed_run_json(
    llama, tmp_path, monkeypatch
):
    from captum_iglens.hf.checksum import weights_checksum
    from captum_iglens.studies.batch import graph_pairs
    from tests.tiny_models import tiny_tokenizer

    rows, out = [{"prompt": "t5 t6"}], tmp_path / "out"
    graph_pairs(llama, tiny_tokenizer(), rows, out, n_steps=2, progress=False)
    partial = out / ".run.json.0123456789abcdef"  # a kill -9 in run.json's write
    partial.write_text("{")
    calls = []

    def counted(model):
        calls.append(model)
        return weights_checksum(model)

    for module in ("graphs", "resume"):
        monkeypatch.setattr(
            f"captum_iglens.studies.batch.{module}.weights_checksum", counted
        )
    graph_pairs(llama, tiny_tokenizer(), rows, out, n_steps=2, progress=False)
    assert len(calls) == 1
    assert sorted(p.name for p in out.iterdir()) == ["graphs", "run.json"]


def test_a_folder_another_run_writes_is_refused_before_the_model_loads(
    tmp_path, capsys, monkeypatch
):
    import socket

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("captum_iglens.hf.models.load_model", _no_model)
    Path("p.jsonl").write_text('{"prompt": "t5 t6"}')
    Path("out").mkdir()
    holder = {"host": socket.gethostname(), "pid": os.getppid()}  # alive, not us
    Path("out/.batch.lock").write_text(json.dumps(holder))
    assert main(["graph", "--pairs", "p.jsonl", "--out", "out", "--model", "m"]) == 2
    err = capsys.readouterr().err
    assert f"--out: out is being written by another run (pid {os.getppid()}" in err
    assert Path("out/.batch.lock").exists()
