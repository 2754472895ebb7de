"""``pgstore completion bash|zsh``: the script, generated from the parser, completes
commands, ``jobs`` actions, options and option values in a real bash."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.support.cli_support import Run, clean_environment, in_process, pgstore_argv, process_env


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Run:
    clean_environment(monkeypatch)
    return in_process(capsys)


def _complete(script: str, *words: str) -> list[str]:
    """What bash offers for the command line ``words`` (the last one being typed)."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed")
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
    program = (f"{script}\nCOMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; "
               "_pgstore; printf '%s\\n' \"${COMPREPLY[@]}\"")
    done = subprocess.run([bash, "--norc", "--noprofile", "-c", program], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout.split()


def test_bash_completes_commands_actions_options_and_values(cli: Run) -> None:
    status, script, err = cli("completion", "bash")
    assert (status, err) == (0, "")
    assert script.rstrip().endswith("complete -F _pgstore pgstore")
    assert _complete(script, "pgstore", "pu") == ["purge"]
    assert _complete(script, "pgstore", "j") == ["jobs"]
    assert _complete(script, "pgstore", "jobs", "res") == ["reschedule"]
    assert _complete(script, "pgstore", "jobs", "--l") == ["--leased", "--limit"]
    assert _complete(script, "pgstore", "jobs", "cancel", "--") == [
        "--help", "--dsn", "--schema", "--json", "--absolute", "--wide"]
    assert _complete(script, "pgstore", "--dsn", "x", "purge", "--d") == ["--dsn", "--dry-run"]
    assert _complete(script, "pgstore", "purge", "--include-failed", "--y") == ["--yes"]
    assert _complete(script, "pgstore", "run", "--log-level", "W") == ["WARNING"]
    assert _complete(script, "pgstore", "completion", "") == ["--help", "bash", "zsh"]
    # Every command of the parser is offered at the first word.
    first = _complete(script, "pgstore", "")
    for command in ("migrate", "jobs", "retry", "status", "purge", "run", "exporter",
                    "completion"):
        assert command in first


def test_zsh_runs_the_bash_script_through_bashcompinit(cli: Run) -> None:
    status, zsh, _ = cli("completion", "zsh")
    bash = cli("completion", "bash")[1]
    assert status == 0 and "bashcompinit" in zsh and zsh.endswith(bash)
    assert cli("completion", "fish")[0] == 2  # a usage error
    done = subprocess.run([*pgstore_argv(), "completion", "bash"], capture_output=True,
                          text=True, env=process_env(), timeout=60)
    assert (done.returncode, done.stdout) == (0, bash)
