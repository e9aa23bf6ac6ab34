"""The benchmarks that measure at scale cannot rot: the GPU script's dry run (a tiny
model on the CPU, every mode it can run there, granularity and path, the flow graph,
one device and a CPU device_map behind accelerate's hooks), ``scale.py``,
``peak_breakdown.py`` and the flow's long-prompt part run in subprocesses on tiny
shapes, as a user would run them."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from captum_iglens.attr.granularities import GRANULARITIES
from captum_iglens.attr.paths import PATHS

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_dry_run():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines()]
    measured = [r for r in rows if r and r[0] == "cpu" and "refused:" not in r]
    for path in PATHS:
        for granularity in ("block", "head", "source", "neuron"):
            found = [r for r in measured if r[3] == path and r[4] == granularity]
            assert found, (path, granularity)
            assert all(float(r[-1]) <= 1e-6 for r in found)  # |Σ − Δp|
    flow = [r for r in measured if r[3:5] == ["flow", "edges"]]
    assert len(flow) == 2  # float32 and bfloat16, one device
    assert all(float(r[-1]) <= 1e-6 for r in flow)  # |Σ − Δm|, conservation
    hooked = [r for r in rows if r[:2] == ["cpu", "x2"]]
    assert len(hooked) == len(PATHS) * len(GRANULARITIES)
    assert "total" in done.stdout


@pytest.mark.slow
def test_scale_table_from_one_run_of_parallel_children():
    """Two children at once; the main map reads every position up to
    ``--map-positions``' length and the last 8 above it; every row adds up."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scale.py"), "--shapes", "tiny"]
        + "--lengths 12 24 --map-positions 12 --granularities block head".split()
        + "--n-steps 4 --jobs 2".split(),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines() if line[:4] == "tiny"]
    found = {(r[1], r[3], r[4]): int(r[5]) for r in rows}
    for dtype in ("float32", "bfloat16"):
        assert found[(dtype, "12", "block")] == 11  # every position
        assert found[(dtype, "24", "block")] == 8  # the answer only
        assert found[(dtype, "24", "head")] == 8
    assert len(rows) == 8
    assert all(float(r[-1]) <= 1e-6 for r in rows)


@pytest.mark.slow
def test_peak_breakdown_accounts_for_the_whole_tensor_peak():
    """The groups add up to the profiler's peak, and a component map's peak is
    its readout's backward chunk: the log-softmax and two gradients."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "peak_breakdown.py")]
        + "--shape tiny --granularity head --length 64 --chunk-mib 1".split()
        + ["--group-kib", "64"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    peak = float(next(x for x in lines if x.startswith("peak of live")).split()[-2])
    groups = [x.split(maxsplit=2) for x in lines if re.match(r"\s*[0-9.]+ MiB  ", x)]
    assert abs(sum(float(g[0]) for g in groups) - peak) <= 0.05 * len(groups) + 0.05
    readout = [
        g for g in groups if "values_and_gradients" in g[2] or "_log_softmax" in g[2]
    ]
    assert len(readout) == 3


@pytest.mark.slow
def test_joint_convergence_dry_run():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "joint.py"), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    split = next(i for i, line in enumerate(lines) if line.startswith("dtype |"))
    rows = [line.split(" | ") for line in lines[2:split]]
    precision = [line.split(" | ") for line in lines[split + 1 :]]
    # the readout's gradient integrated along the line gives back f's change,
    # to float rounding in each dtype (the part measures where it does not)
    assert [row[0] for row in precision] == ["float32", "float64"]
    assert abs(float(precision[0][5])) <= 1e-7
    # transformers' RMSNorm takes its variance in float32 even in a float64 copy,
    # so the float64 row is float32 rounding relative to f (about 2e-4 here)
    assert abs(float(precision[1][5])) <= 1e-9
    from captum_iglens.attr.estimators import ESTIMATORS

    assert sorted({row[0] for row in rows}) == sorted(ESTIMATORS)
    for row in rows:
        if ESTIMATORS[row[0]].exact:
            assert float(row[4]) <= 1e-6  # |Σ − Δp| at any n_steps
    assert {row[5] for row in rows if row[0] == "adaptive"} == {"yes"}


@pytest.mark.slow
def test_flow_long_dry_run():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "flow.py"), "long", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("tiny (float32), 16 tokens, n_steps 2, qkv yes")
    assert "1 MiB: 2 path point(s) per forward" in line  # chosen by the budget
    found = re.search(r"\|Σ-Δm\| (\S+), worst conservation (\S+),", line)
    assert found and max(float(found[1]), float(found[2])) <= 1e-6


@pytest.mark.slow
def test_flow_onset_dry_run(tmp_path):
    out = tmp_path / "study.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "flow_onset.py"),
            "--dry-run",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for corruption in ("noise", "counterfactual"):
        assert re.search(rf"^\[{corruption} / all\] \d tokens$", done.stdout, re.M)
    assert len(re.findall(r"^ig_lens_flow +\d ", done.stdout, re.M)) >= 2
    assert re.search(
        r"^  ig_lens_flow \(n_steps=2\): noise [\d.]+ s, 8 runs .*; "
        r"counterfactual [\d.]+ s, 4 runs",
        done.stdout,
        re.M,
    )
    from captum_iglens.studies.validation import RestorationResult

    result = RestorationResult.load(out)
    assert len(result.facts) == 4
    # the share after the last block is 1 on every traced fact (cut completeness)
    last = [
        row[-1]
        for by_method in result.traced_shares.values()
        for row in by_method["ig_lens_flow"]
    ]
    assert len(last) == 8 and np.allclose(last, 1.0, atol=1e-9)


@pytest.mark.slow
def test_flow_noise_dry_run_resumes_from_its_records(tmp_path):
    def run():
        return subprocess.run(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "flow_noise.py"),
                "--dry-run",
                "--state-paths",
                "1",
                "--cache",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=ROOT,
        )

    first = run()
    assert first.returncode == 0, first.stderr[-2000:]
    assert len(re.findall(r"^fact \d/4: t\d$", first.stdout, re.M)) == 4
    assert re.search(
        r"^4 facts \(2 even, 2 odd\); threshold [\d.]+ ", first.stdout, re.M
    )
    for corruption in ("noise", "counterfactual"):
        assert re.search(
            rf"^\| {corruption} \| all \| share >= 1/2 \| \d \|", first.stdout, re.M
        )
    assert re.search(
        r"^\| noise \| \w+ \| state path >= 1/2 \| 1 \|", first.stdout, re.M
    )
    assert re.search(r"^\| 0\.1 \| \d \|", first.stdout, re.M)  # a reduced scale
    records = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*.json"))]
    assert len(records) == 4
    for record in records:
        # the flow's share after the last block is 1 (cut completeness)
        assert np.isclose(record["noise"]["shares"][-1], 1.0, atol=1e-9)
    again = run()  # every record is read back: nothing recomputed, same tables
    assert again.returncode == 0, again.stderr[-2000:]
    assert "fact " not in again.stdout
    assert again.stdout == first.stdout[first.stdout.index("4 facts") :]


def test_flow_noise_chooses_its_threshold_on_the_even_facts_only(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import flow_noise

    def record(index, shares):
        # restoring recovers everything from block 6 on: the causal onset is 6
        restored = [0.1] * 6 + [1.0] * 4
        cell = dict(shares=shares, clean=1.0, corrupt=0.1, restored=restored)
        return dict(index=index, target=0, noise=cell)

    rises_late = [0.0, 0.0, 0.6, 0.6, 0.6, 0.6, 1.0, 1.0, 1.0, 1.0]  # > 0.6 at 6
    rises_early = [0.0, 0.0, 0.9, 0.9, 0.9, 0.9, 1.0, 1.0, 1.0, 1.0]  # > 0.9 at 6
    study = flow_noise.STUDY
    even = [record(i, rises_late) for i in (0, 2, 4)]
    odd = [record(i, rises_early) for i in (1, 3, 5, 7, 9)]
    assert flow_noise.choose_threshold(even + odd, study) == 0.65
    assert (
        flow_noise.choose_threshold(
            [dict(r, index=r["index"] + 1) for r in even + odd], study
        )
        == 0.95
    )
    table = "\n".join(flow_noise.rule_table(even + odd, 0.65, study))
    assert "| noise | even | share >= 0.65 | 3 | 1.00 [1.00, 1.00] | +0.00" in table
    assert "| noise | odd | share >= 1/2 | 5 | 0.00 [0.00, 0.00] | -4.00" in table


def test_flow_onset_checks_the_output_first(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "flow_onset.py"),
            "--dry-run",
            "--json",
            str(tmp_path / "missing" / "study.json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode != 0
    assert "the folder" in done.stderr and "does not exist" in done.stderr
    assert "restoration at the attributed position" not in done.stdout  # refused first


@pytest.mark.slow
def test_circuits_table_from_a_model_folder_and_a_task_file(tmp_path, tiny_folder):
    """The benchmark runs the command per model and task and prints one row
    per method, with a rank correlation per ground truth where it was run."""
    folder, pair = tiny_folder
    task = tmp_path / "mine.jsonl"
    pairs = [pair, dict(pair, counterfactual="t9 t6 t7 t8")]
    task.write_text("".join(json.dumps(p) + "\n" for p in pairs), encoding="utf-8")
    command = [sys.executable, str(ROOT / "benchmarks" / "circuits.py")]
    command += ["--models", str(folder), "--tasks", str(task), "--pairs", "2"]
    command += ["--methods", "eap,random,patching-nodes", "--out", str(tmp_path / "r")]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    head = next(line for line in lines if line.startswith("| model |"))
    assert "| ρ with patching / patching-nodes / patching-nodes-denoising |" in head
    rows = [line for line in lines if line.startswith(f"| {folder.name} | mine |")]
    assert [row.split(" | ")[3] for row in rows] == ["eap", "random"]
    result = json.loads((tmp_path / "r" / f"{folder.name}-mine.json").read_text())
    for row in rows:
        method = row.split(" | ")[3]
        rho = result["correlations"]["patching-nodes"][method]
        assert row.split(" | ")[6] == f"— / {rho:+.2f} / —"


@pytest.mark.slow
def test_circuits_rules_match_the_two_methods_they_cross(tmp_path, tiny_folder):
    """The ablation's ``product-left`` is EAP-IG-inputs and its
    ``steps-trapezoid`` the flow's first-order terms, each written a second
    time, on each of two tasks of one run; the two crossed rules differ from
    both."""
    import torch

    from captum_iglens.graph.circuit import legal_edges
    from captum_iglens.graph.model_graph import model_graph

    folder, pair = tiny_folder
    tasks = {
        "mine": [pair, dict(pair, counterfactual="t9 t6 t7 t8")],
        "other": [dict(pair, counterfactual=f"t5 t6 {t} t8") for t in ("t9", "t4")],
    }
    for name, pairs in tasks.items():
        lines = "".join(json.dumps(p) + "\n" for p in pairs)
        (tmp_path / f"{name}.jsonl").write_text(lines, encoding="utf-8")
    methods = "eap-ig-inputs,flow-plain:5,product-left:5,product-trapezoid:5,"
    methods += "steps-left:5,steps-trapezoid:5"
    command = [sys.executable, str(ROOT / "benchmarks" / "circuits_rules.py")]
    command += ["--models", str(folder), "--pairs", "2", "--tasks"]
    command += [str(tmp_path / f"{name}.jsonl") for name in tasks]
    command += ["--methods", methods, "--out", str(tmp_path / "r")]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    config = json.loads((folder / "config.json").read_text())
    graph = model_graph(config["num_hidden_layers"], config["num_attention_heads"])
    legal = legal_edges(graph)

    def near(a, b):
        return torch.allclose(a, b, rtol=1e-4, atol=1e-6 * float(b.abs().max()))

    for task in tasks:
        rows = [line for line in done.stdout.splitlines() if f"| {task} |" in line]
        assert len(rows) == 6
        saved = tmp_path / "r" / f"{folder.name}-{task}" / "methods"

        def scores(name):  # on the graph's edges
            path = saved / f"{name.replace(':', '-')}.pt"
            return torch.load(path, weights_only=True)[legal]

        assert near(scores("product-left:5"), scores("eap-ig-inputs"))
        assert near(scores("steps-trapezoid:5"), scores("flow-plain:5"))
        for crossed in ("product-trapezoid:5", "steps-left:5"):
            assert not near(scores(crossed), scores("eap-ig-inputs"))
            assert not near(scores(crossed), scores("flow-plain:5"))


@pytest.mark.slow
def test_task_signal_from_a_model_folder_and_a_task_file(tmp_path, tiny_folder):
    """The table's Δm is the mean over the kept pairs of m(clean) − m(cf)."""
    folder, pair = tiny_folder
    task = tmp_path / "mine.jsonl"
    pairs = [pair, dict(pair, counterfactual="t9 t6 t7 t8")]
    task.write_text("".join(json.dumps(p) + "\n" for p in pairs), encoding="utf-8")
    command = [sys.executable, str(ROOT / "benchmarks" / "task_signal.py")]
    command += ["--models", str(folder), "--tasks", str(task), "--pairs", "2"]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    row = next(
        x for x in done.stdout.splitlines() if x.startswith(f"| {folder.name} |")
    )
    cells = row.split(" | ")
    assert cells[1:3] == ["mine", "2 / 2"]  # the fixture's answer is the top token
    clean, other, delta = float(cells[3]), float(cells[4]), cells[5]
    assert float(delta.split(" ")[0]) == pytest.approx(clean - other, abs=2e-3)


@pytest.mark.slow
def test_flow_batch_dry_run():
    """A batch of 3 pairs of a tiny model against the pairs one at a time: the
    budget puts all three in one forward, and each graph is its graph alone."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "flow.py"), "batch", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    head, wall, cpu, check = done.stdout.strip().splitlines()[-4:]
    assert head.startswith("tiny, 3 pairs of 12 tokens, n_steps 2, budget 256 MiB")
    assert "9 path points per forward, 3 pair(s) per forward" in head
    for line, clock in ((wall, "wall"), (cpu, "CPU")):
        assert re.match(
            rf"  {clock} time: one at a time \S+ s .* per pair \S+ x$", line
        )
    found = re.search(r"largest gap (\S+) of .* conservation (\S+);", check)
    assert found and max(float(found[1]), float(found[2])) <= 1e-6


@pytest.mark.slow
def test_circuits_search_runs_the_search_its_ablation_and_its_start(
    tmp_path, tiny_folder
):
    """The search's benchmark: one row per method, the split recorded."""
    from tests.helpers import task_lines

    folder, _ = tiny_folder
    task = tmp_path / "mine.jsonl"
    task.write_text("\n".join(task_lines(folder, 7)) + "\n", encoding="utf-8")
    command = [sys.executable, str(ROOT / "benchmarks" / "circuits_search.py")]
    command += ["--models", str(folder), "--tasks", str(task), "--pairs", "3"]
    command += ["--train", "4", "--bootstrap", "20", "--out", str(tmp_path / "r")]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if "| mine |" in line]
    assert [row.split(" | ")[3] for row in rows] == [
        "eap-ig-inputs:5",
        "search:eap-ig-inputs:5",
        "search-at-model:eap-ig-inputs:5",
    ]
    result = json.loads((tmp_path / "r" / f"{folder.name}-mine.json").read_text())
    assert len(result["split"]["train"]) == 4
