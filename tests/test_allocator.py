"""The CLI's process gives freed large buffers back to the system."""

import subprocess
import sys

import pytest

# Readout chunks of 16 MiB freed while small tensors allocated between them
# live on: glibc's growing mmap threshold carves them from the heap, where the
# freed space stays resident (the climbing memory of a long attribution).
SCENARIO = """
import sys
import torch
from captum_iglens._utils.allocator import return_freed_memory

def rss_mib():
    with open("/proc/self/status") as status:
        line = next(l for l in status if l.startswith("VmRSS"))
    return int(line.split()[1]) // 1024

if sys.argv[1] == "set":
    assert return_freed_memory()
x = torch.ones(8 << 20)
del x  # a freed 32 MiB buffer: the threshold grows to it unless fixed
start, keep = rss_mib(), []
for _ in range(3):
    chunks = [torch.ones(4 << 20) for _ in range(20)]
    keep += [torch.ones(1000) for _ in chunks]
    del chunks
print(rss_mib() - start)
"""


def _grown_mib(mode):
    done = subprocess.run(
        [sys.executable, "-c", SCENARIO, mode],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout.split()[-1])


def test_freed_chunks_go_back_to_the_system():
    assert _grown_mib("default") > 200  # the retention the fix removes
    assert _grown_mib("set") < 50


def test_the_cli_sets_the_threshold_before_any_work(monkeypatch):
    from captum_iglens import cli

    calls = []
    monkeypatch.setattr(cli, "return_freed_memory", lambda: calls.append(1))
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert calls == [1]
