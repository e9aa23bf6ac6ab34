"""Every output is written to what the user named: a device or FIFO is refused, a
link is written through, and no output replaces one of the run's inputs or another
output, in the library and in every command, before the model loads."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import captum_iglens

from captum_iglens._utils.output_paths import check_not_input, check_writable
from captum_iglens._utils.serialization import write_atomic
from captum_iglens.cli import main

PROMPT = "The capital of France is"


def _no_model(*args, **kwargs):
    raise AssertionError("the model was loaded")


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe.json"
    os.mkfifo(path)
    return path


def test_a_device_or_fifo_is_refused_before_any_work(fifo):
    # Only checked, never written: /dev/full is a character device.
    for path in ("/dev/full", fifo):
        with pytest.raises(ValueError, match="--json: .* is not a regular file"):
            check_writable(path, "--json")


def test_write_atomic_refuses_a_fifo(fifo):
    with pytest.raises(ValueError, match="not a regular file"):
        write_atomic(fifo, "{}")
    assert fifo.is_fifo()


def test_a_link_is_written_through_and_stays_a_link(tmp_path):
    (tmp_path / "runs").mkdir()
    target = tmp_path / "runs" / "result.json"
    target.write_text("old")
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    check_writable(link, "--json")
    write_atomic(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new"
    dangling = tmp_path / "next.json"
    dangling.symlink_to(tmp_path / "runs" / "next.json")
    write_atomic(dangling, b"\x89PNG")
    assert dangling.is_symlink()
    assert (tmp_path / "runs" / "next.json").read_bytes() == b"\x89PNG"
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [
        "next.json",
        "result.json",
    ]


def test_an_output_may_not_be_an_input_or_inside_an_input_folder(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    task = tmp_path / "task.jsonl"
    task.write_text("")
    inputs = {"--model": str(model), "--task": str(task), "--lens": "tuned"}
    with pytest.raises(ValueError, match="--json: .* is the run's input --task"):
        check_not_input(task, "--json", inputs)
    link = tmp_path / "alias.jsonl"
    link.symlink_to(task)
    with pytest.raises(ValueError, match="the run's input --task"):
        check_not_input(link, "--json", inputs)
    with pytest.raises(ValueError, match="a file in the folder of --model"):
        check_not_input(model / "config.json", "--html", inputs)
    check_not_input(model / "new.html", "--html", inputs)  # replaces nothing
    (model / "old.html").write_text("<html>")  # an earlier run's page
    check_not_input(model / "old.html", "--html", inputs)
    (model / "old.json").write_text('{"kind": "iglens_result", "format": 1}')
    check_not_input(model / "old.json", "--json", inputs)
    (model / "tokenizer.json").write_text('{"version": "1.0"}')
    with pytest.raises(ValueError, match="not one this package wrote"):
        check_not_input(model / "tokenizer.json", "--json", inputs)
    check_not_input(tmp_path / "out.json", "--json", inputs)
    records = {"--out": str(model)}
    with pytest.raises(ValueError, match="inside --out .*keeps its records"):
        check_not_input(model / "new.html", "--html", records, written=["--out"])


def _refused(capsys, argv, named):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert named in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_graph_refuses_outputs_that_would_replace_its_inputs(
    monkeypatch, capsys, tmp_path, fifo
):
    monkeypatch.setattr("captum_iglens.hf.models.load_embedded", _no_model)
    monkeypatch.setattr("captum_iglens.cli.common.load", _no_model)
    model = tmp_path / "model"
    model.mkdir()
    config = model / "config.json"
    config.write_text('{"model_type": "llama"}')
    graph = ["graph", PROMPT, "--model", str(model)]
    _refused(capsys, [*graph, "--json", str(config)], "a file in the folder of --model")
    assert config.read_text() == '{"model_type": "llama"}'
    _refused(capsys, [*graph, "--json", str(fifo)], "--json: ")
    assert fifo.is_fifo()


def test_circuits_refuses_outputs_that_would_replace_its_inputs(
    monkeypatch, capsys, tmp_path
):
    monkeypatch.setattr("captum_iglens.hf.models.load_embedded", _no_model)
    monkeypatch.setattr("captum_iglens.cli.common.load", _no_model)
    task = tmp_path / "t.jsonl"
    task.write_text("kept\n")
    base = ["circuits", "--task", str(task), "--methods", "random"]
    _refused(capsys, [*base, "--json", str(task)], "the run's input --task")
    assert task.read_text() == "kept\n"
    out = tmp_path / "a.out"
    _refused(
        capsys, [*base, "--json", str(out), "--html", str(out)], "the same path as"
    )
    records = tmp_path / "records"
    records.mkdir()
    _refused(
        capsys,
        [*base, "--out", str(records), "--json", str(records / "c.json")],
        "inside --out",
    )


_REFUSED = """
import sys
from captum_iglens.cli import main
code = main(sys.argv[1:])
print(sorted({"torch", "transformers"} & set(sys.modules)))
sys.exit(code)
"""


_LONG = "word " * 3000


@pytest.mark.parametrize(
    "argv, named",
    [
        (["graph", PROMPT, "--json", "/dev/full"], "--json: /dev/full exists and is"),
        pytest.param(
            ["graph", _LONG, "--receiver-positions"],
            "--receiver-positions: the flows by sender and receiver position need",
            marks=pytest.mark.real_model,  # the embedded model's tokenizer file
        ),
        (["graph", PROMPT, "--n-steps", "100000"], "--n-steps: expected at most"),
        (["circuits", "--task", "ioi", "--html", "FIFO"], "--html: "),
    ],
)
def test_refusals_before_the_model_answer_at_once_without_torch(tmp_path, argv, named):
    os.mkfifo(tmp_path / "pipe.html")
    argv = [str(tmp_path / "pipe.html") if a == "FIFO" else a for a in argv]
    root = str(Path(captum_iglens.__file__).parents[1])
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])
    )
    start = time.perf_counter()
    ran = subprocess.run(
        [sys.executable, "-c", _REFUSED, *argv], capture_output=True, text=True, env=env
    )
    assert time.perf_counter() - start < 2.0
    assert ran.returncode == 2 and named in ran.stderr, ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1
    assert ran.stdout.splitlines()[-1] == "[]"  # neither torch nor transformers
