"""The `codepost` program as a user meets it: its version and environment report, each command's
refusal of input it cannot use (exit 2, one line naming the input, before anything starts), and
an exit with no leak report from the libraries it loaded."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from endpoints import closed_port_url

from codepost import __version__
from codepost.flows import cli
from codepost.settings.command_line import EXIT_BAD_INPUT

MISSING = "nobody/no-such-model"


def test_version_and_environment_for_a_bug_report(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"codepost {__version__}\n"
    assert cli.main(["env"]) == 0
    report = dict(
        line.removeprefix("- ").split(": ", 1) for line in capsys.readouterr().out.splitlines()
    )
    assert set(report) >= {"codepost", "python", "torch", "transformers", "trl", "vllm", "prefect"}
    assert report["python"].startswith(sys.version.split()[0])
    assert report["devices"].startswith("CPU: ")
    assert "image codepost-sandbox:latest" in report["docker"]  # an id, or how to build it


@pytest.mark.parametrize(
    "command",
    [["run", "--model.name-or-path", MISSING, "--run-dir"], ["evaluate", MISSING, "--output"]],
)
def test_a_hub_model_out_of_reach_is_refused_naming_it(tmp_path, capsys, monkeypatch, command):
    """Accepted before, it failed with exit 1 after 176 s, in the first stage."""
    argv = [*command, str(tmp_path / "out")]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cli.main(argv) == EXIT_BAD_INPUT
    err = " ".join(capsys.readouterr().err.split())
    assert f"model '{MISSING}': not in the Hugging Face cache, and HF_HUB_OFFLINE is set" in err
    monkeypatch.delenv("HF_HUB_OFFLINE")
    hub = closed_port_url()
    monkeypatch.setenv("HF_ENDPOINT", hub)
    started = time.monotonic()
    assert cli.main(argv) == EXIT_BAD_INPUT
    assert time.monotonic() - started < 30  # seconds, not minutes of retries
    err = " ".join(capsys.readouterr().err.split())
    assert f"model '{MISSING}'" in err and f"the hub ({hub}) is out of reach: no answer" in err
    assert not (tmp_path / "out").exists()


def test_evaluate_refuses_a_misspelt_problem_set_naming_the_close_one(tmp_path, capsys):
    argv = ["evaluate", "--problems.source", "humanevl", "--output", str(tmp_path / "out")]
    assert cli.main(argv) == EXIT_BAD_INPUT  # a traceback and exit 1 before
    err = " ".join(capsys.readouterr().err.split())
    assert "no problem set 'humanevl'" in err and "did you mean 'humaneval'?" in err
    assert not (tmp_path / "out").exists()


def test_a_refusal_is_one_line_per_problem_however_long(tmp_path, capsys):
    """Rich folded a refusal into 80 columns when stderr was not a terminal."""
    assert cli.main(["run", "--stages.rl.iterations", "0", "--run-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "codepost run: invalid settings: --stages.rl.iterations 0: Input should be greater "
        "than or equal to 1\n"
    )


def test_the_program_exits_without_a_leak_report_of_the_libraries_it_loaded(tmp_path):
    """triton's bindings (loaded with torch by `run` and `evaluate`) printed 27 lines of
    `nanobind: leaked ...` after the result: the exit skipped the last collection."""
    program = (
        "import sys\n"
        "import triton.language  # as a run's stages load it\n"
        "from codepost.flows.cli import entry\n"
        f"sys.argv = ['codepost', 'run', '--print-config', '--run-dir', {str(tmp_path)!r}]\n"
        "sys.exit(entry())\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "leaked" not in done.stderr and done.stdout.startswith("run_dir: ")
