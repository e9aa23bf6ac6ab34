"""``captum-iglens shell``, driven as a user would drive it: through a real
pseudo-terminal (pexpect), so that readline, the prompt, Ctrl-D and Ctrl-C are
the terminal's own."""

import os
import signal
import sys

import pexpect
import pytest

from captum_iglens import IGLensResult
from captum_iglens.attr.flow.graph import FlowGraph
from tests.helpers import hook_snapshot, word_tokenizer

PROMPT = "iglens> "
LEGEND = "lens@top: last readout; onset"


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from tests.tiny_models import tiny_model

    folder = tmp_path_factory.mktemp("model")
    tiny_model("llama").save_pretrained(folder)
    word_tokenizer(128).save_pretrained(folder)
    return str(folder)


def _as_at_a_terminal() -> None:
    """Ctrl-C interrupts, as at a user's terminal, even when the tests run
    where SIGINT is ignored and every child inherits that (a background job
    of a shell without job control: ``nohup … &``)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _spawn(tmp_path, *args: str, timeout: int = 180) -> pexpect.spawn:
    env = {
        **os.environ,
        "CAPTUM_IGLENS_CACHE": str(tmp_path / "cache"),
        "COLUMNS": "160",
    }
    shell = pexpect.spawn(
        sys.executable,
        ["-m", "captum_iglens", "shell", *args],
        env=env,
        encoding="utf-8",
        timeout=timeout,
        dimensions=(40, 160),
        preexec_fn=_as_at_a_terminal,
    )
    shell.expect_exact(PROMPT)
    return shell


def _finish(shell: pexpect.spawn) -> str:
    """The rest of the output; the process must have ended with status 0."""
    shell.expect(pexpect.EOF)
    rest = shell.before
    shell.close()
    assert shell.exitstatus == 0, rest
    assert "Traceback" not in rest
    return rest


def test_prompts_options_and_files_in_one_session(tiny_folder, tmp_path):
    shell = _spawn(
        tmp_path, "--model", tiny_folder, "--no-chat", "--max-new-tokens", "2"
    )
    shell.sendline("w5 w6")
    shell.expect(r"token +L0 +L1 +lens@top")
    shell.expect(r"completeness: max \|Σ - Δp\| = ([0-9.e+-]+)")
    assert float(shell.match.group(1)) <= 1e-6
    shell.expect_exact(LEGEND)
    shell.expect_exact(PROMPT)

    shell.sendline(":set granularity head")
    shell.expect_exact(PROMPT)
    shell.sendline("w5 w6")
    shell.expect(r"token .*L\d\.attn\.h\d")
    shell.expect_exact("top heads (by |credit|")
    shell.expect_exact(PROMPT)

    page, saved = tmp_path / "out.html", tmp_path / "out.json"
    shell.sendline(f":html {page}")
    shell.expect_exact(f"wrote {page}")
    shell.sendline(f":json {saved}")
    shell.expect_exact(f"wrote {saved}")
    for kind in ("csv", "json", "html"):  # issue 48: not "wrote " and nothing
        shell.sendline(f':{kind} ""')
        shell.expect_exact(f"error: --{kind}: the path is empty")
    shell.sendline(":set model gemma3")
    shell.expect_exact("error: --model: the model's options are fixed")
    shell.sendline(":set layers 0,9")
    shell.expect_exact("error: --layers: the model has 2 blocks")
    shell.sendline(":set n-steps 0")
    shell.expect_exact("error: --n-steps: expected an int >= 1")
    shell.sendline(":unset granularity")
    shell.expect_exact(PROMPT)
    shell.sendline(":show")
    shell.expect(r"--granularity 'block'")
    shell.expect_exact(PROMPT)
    shell.sendeof()
    _finish(shell)

    assert page.read_text().startswith("<!DOCTYPE html>")
    result = IGLensResult.load(saved)
    assert any(".attn.h" in name for name in result.layer_names)
    assert (result.total - (result.model_prob - result.base_prob)).abs().max() <= 1e-6
    history = (tmp_path / "cache" / "shell_history").read_text()
    assert ":set granularity head" in history and "w5 w6" in history


def test_ctrl_c_at_the_prompt_ends_the_session_cleanly(tiny_folder, tmp_path):
    shell = _spawn(tmp_path, "--model", tiny_folder, "--no-chat")
    shell.sendline(":bogus")
    shell.expect_exact("error: :bogus: not a command; :help lists them")
    shell.expect_exact(PROMPT)
    _interrupt_until_it_ends(shell)
    _finish(shell)


def _interrupt_until_it_ends(shell: pexpect.spawn, tries: int = 5) -> None:
    """Ctrl-C until the session ends. readline prints the prompt before it
    waits for input, and a SIGINT that arrives in between is only seen at the
    next signal (CPython's readline checks signals when its wait is
    interrupted), so on a loaded machine one Ctrl-C can go unseen; a user
    presses it again."""
    for _ in range(tries):
        shell.sendintr()
        if shell.expect([pexpect.EOF, pexpect.TIMEOUT], timeout=20) == 0:
            return
    raise AssertionError(f"the session did not end after {tries} Ctrl-C")


def test_no_result_to_write_yet(tiny_folder, tmp_path):
    shell = _spawn(tmp_path, "--model", tiny_folder, "--no-chat")
    shell.sendline(f":html {tmp_path / 'x.html'}")
    shell.expect_exact("error: :html: no result yet; type a prompt first")
    shell.sendline(":quit")
    _finish(shell)
    assert not (tmp_path / "x.html").exists()


def test_graph_of_the_last_prompt_and_its_files(tiny_folder, tmp_path):
    shell = _spawn(tmp_path, "--model", tiny_folder, "--no-chat")
    shell.sendline("w5 w6")
    shell.expect_exact(LEGEND)
    shell.expect_exact(PROMPT)
    shell.sendline(":graph  w5 w7 ")
    shell.expect(r"Δm = ([0-9.e+-]+)")
    shell.expect(r"edge +flow +share")
    shell.expect(r"completeness: \|Σ F\(u->logits\) - Δm\| = ([0-9.e+-]+)")
    assert float(shell.match.group(1)) <= 1e-6
    shell.expect_exact(PROMPT)
    saved, page, table = (tmp_path / name for name in ("g.json", "g.html", "g.csv"))
    for kind, path in (("json", saved), ("html", page), ("csv", table)):
        shell.sendline(f":{kind} {path}")
        shell.expect_exact(f"wrote {path}")
    shell.sendline(f":png {tmp_path / 'g.png'}")
    shell.expect_exact("error: :png: the last result is a graph")
    shell.sendline(':json ""')
    shell.expect_exact("error: --json: the path is empty")
    shell.sendline(":set target-kind kl")
    shell.expect_exact("error: --target-kind: invalid choice: 'kl'")
    shell.sendline(":set foil w9")
    shell.expect_exact(PROMPT)
    shell.sendline(":graph w5 w7")
    shell.expect_exact("error: --foil: --target-kind 'prob' takes no foil")
    shell.sendline(":set target-kind logit_diff")
    shell.expect_exact(PROMPT)
    shell.sendline(":set qkv on")
    shell.expect_exact(PROMPT)
    shell.sendline(":graph w5 w7")
    shell.expect_exact("completeness: |Σ F(u->logits) - Δm|")
    shell.expect_exact(PROMPT)
    with_qkv = tmp_path / "qkv.json"
    shell.sendline(f":json {with_qkv}")
    shell.expect_exact(f"wrote {with_qkv}")
    shell.sendline(":quit")
    _finish(shell)

    graph = FlowGraph.load(saved)
    assert graph.counterfactual["kind"] == "prompt"
    assert graph.completeness_error < 1e-6
    assert sum(
        flow for edge, flow in graph.edge_scores().items() if edge.endswith("->logits")
    ) == pytest.approx(graph.delta_m, abs=1e-6)
    assert not any("<q>" in edge for edge in graph.edges)
    assert page.read_text().startswith("<!DOCTYPE html>")
    assert table.read_text().splitlines()[0] == "edge,sender,receiver,flow,share,effect"
    contrast = FlowGraph.load(with_qkv)
    assert contrast.settings["target_kind"] == "logit_diff"
    assert contrast.completeness_error < 1e-6
    assert any("<q>" in edge for edge in contrast.edges)


def test_graph_errors_are_one_line_and_the_session_goes_on(tiny_folder, tmp_path):
    shell = _spawn(tmp_path, "--model", tiny_folder, "--no-chat")
    shell.sendline(":graph w5 w7")
    shell.expect_exact("error: :graph: no prompt yet; type a prompt first")
    shell.sendline("w5 w6")
    shell.expect_exact(LEGEND)
    shell.expect_exact(PROMPT)
    shell.sendline(":graph")
    shell.expect_exact("error: :graph: expected the counterfactual prompt")
    shell.sendline(":graph w5 w6 w7")
    shell.expect(r"error: --counterfactual: (\d+) tokens, but the prompt has (\d+)")
    assert int(shell.match.group(1)) == int(shell.match.group(2)) + 1
    shell.expect_exact(PROMPT)
    shell.sendline(":graph it's w7")  # a quote is text, not shell syntax
    shell.expect_exact("error: --counterfactual:")
    shell.expect_exact(PROMPT)
    shell.sendline(":graph w5 w7")
    shell.expect_exact("completeness: |Σ F(u->logits) - Δm|")
    shell.expect_exact(PROMPT)
    shell.sendline(":quit")
    rest = _finish(shell)
    assert "error" not in rest


def test_graph_leaves_no_hook_on_the_model(tiny_folder, capsys):
    from captum_iglens.cli import build_parser
    from captum_iglens.cli.shell import Session

    args = build_parser().parse_args(["shell", "--model", tiny_folder, "--no-chat"])
    session = Session(args)
    session.handle("w5 w6")
    session.handle(":set qkv on")
    session.handle(":graph w5 w7")
    assert "completeness: |Σ F(u->logits) - Δm|" in capsys.readouterr().out
    assert isinstance(session.last, FlowGraph)
    for name, hooks in hook_snapshot(session.parts.model).items():
        assert not any(hooks), name


@pytest.mark.real_model
def test_shell_on_the_default_model(tmp_path):
    # The default model's cache is the user's; only the history goes elsewhere.
    shell = pexpect.spawn(
        sys.executable,
        ["-m", "captum_iglens", "shell", "--max-new-tokens", "4"],
        env={**os.environ, "COLUMNS": "200"},
        encoding="utf-8",
        timeout=600,
        dimensions=(40, 200),
        preexec_fn=_as_at_a_terminal,
    )
    shell.expect_exact(PROMPT)
    shell.sendline("What is the capital of France?")
    shell.expect(r"completeness: max \|Σ - Δp\| = ([0-9.e+-]+)")
    assert float(shell.match.group(1)) <= 1e-6
    shell.expect_exact(LEGEND)
    shell.expect_exact(PROMPT)
    shell.sendline(":set granularity sublayer")
    shell.expect_exact(PROMPT)
    shell.sendline("What is the capital of France?")
    shell.expect(r"L\d+\.(attn|mlp) ")
    shell.expect_exact(PROMPT)
    _interrupt_until_it_ends(shell)
    _finish(shell)


def test_help_shows_three_worked_examples(capsys):
    from captum_iglens.cli import main

    with pytest.raises(SystemExit) as exit:
        main(["--help"])
    out = capsys.readouterr().out
    examples = out.split("examples:\n", 1)[1]
    commands = [line for line in examples.splitlines() if line.startswith("  captum")]
    assert exit.value.code == 0 and len(commands) == 3
    assert any(" shell" in line for line in commands)
