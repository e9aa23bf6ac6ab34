"""``circuits`` under ``torchrun``: two processes share the pairs' batches and
write one process's scores, curves, CPR and CMD to the last bit, resuming a
folder's records, a search's included. Both compute with one CPU thread (the
last bits of a float sum depend on the thread count)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from captum_iglens.cli import main
from tests.helpers import task_lines

ROOT = Path(__file__).resolve().parents[3]
METHODS = "eap,eap-ig-inputs:2,eap-ig-activations:2,flow:2,joint,random,"
METHODS += "mean:eap+flow:2,patching-nodes,patching"


def _task(path, pair):
    """Five rows of the tiny model's pair, each with another foil (three
    batches of two: the processes' shares differ)."""
    foils = [f"t{i}" for i in range(4, 10) if f"t{i}" != pair["answer"]]
    rows = [json.dumps(dict(pair, foil=foil)) for foil in foils[:5]]
    path.write_text("\n".join(rows) + "\n")
    return path


def _without_seconds(result):
    """A result's JSON but its wall times."""
    del result["seconds"]
    for curve in result["curves"]:
        del curve["seconds"]
    return result


@pytest.mark.slow
def test_two_torchrun_processes_score_as_one_and_resume(tiny_folder, tmp_path):
    folder, pair = tiny_folder
    task = _task(tmp_path / "task.jsonl", pair)
    argv = ["circuits", "--task", str(task), "--model", str(folder)]
    argv += ["--methods", METHODS, "--sample", "20", "--bootstrap", "20"]
    argv += ["--batch-size", "2"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = [
            *argv,
            "--out",
            str(tmp_path / "one"),
            "--json",
            str(tmp_path / "1.json"),
        ]
        assert main(one) == 0
    finally:
        torch.set_num_threads(threads)
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    for path in (tmp_path / "two" / "methods").iterdir():
        if not path.name.startswith("eap."):
            path.unlink()  # all but eap's record: scored again by two processes
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", "-m", "captum_iglens", *argv]
    command += ["--out", str(tmp_path / "two"), "--json", str(tmp_path / "2.json")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("CPR") == 1  # rank 0 prints the table
    assert done.stderr.count("eap: resumed") == 1
    assert done.stderr.count("\nflow:2: score") == 1
    expected = _without_seconds(json.loads((tmp_path / "1.json").read_text()))
    found = _without_seconds(json.loads((tmp_path / "2.json").read_text()))
    assert [c["method"] for c in found["curves"]][-1] == "mean:eap+flow:2"
    assert found == expected  # CPR, CMD, their intervals, f, the correlations
    names = sorted(p.name for p in (tmp_path / "one" / "methods").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "two" / "methods").iterdir())
    for name in (n for n in names if n.endswith(".pt")):
        one, two = (
            torch.load(tmp_path / run / "methods" / name, weights_only=True)
            for run in ("one", "two")
        )
        assert torch.equal(one.nan_to_num(7.0), two.nan_to_num(7.0)), name


def _one_and_two(argv, tmp_path):
    """``argv``'s result JSON in one process and under two torchrun processes
    (one thread each), and the two processes' stderr."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main([*argv, "--json", str(tmp_path / "1.json")]) == 0
    finally:
        torch.set_num_threads(threads)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", "-m", "captum_iglens", *argv]
    command += ["--json", str(tmp_path / "2.json")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return [
        _without_seconds(json.loads((tmp_path / f"{n}.json").read_text()))
        for n in (1, 2)
    ]


@pytest.mark.slow
def test_a_search_shares_its_batches_and_finds_one_process_s_circuits(
    tiny_folder, tmp_path
):
    folder, _ = tiny_folder
    task = tmp_path / "task.jsonl"
    task.write_text("\n".join(task_lines(folder, 8)) + "\n")
    argv = ["circuits", "--task", str(task), "--model", str(folder)]
    argv += ["--methods", "search:eap", "--pairs", "2", "--train", "5"]
    argv += ["--batch-size", "2", "--bootstrap", "20"]  # 3 training batches
    one, two = _one_and_two(argv, tmp_path)
    assert one["split"]["train"] == two["split"]["train"]
    assert two == one  # the search's circuits, f, CPR and CMD
