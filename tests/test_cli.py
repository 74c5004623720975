"""The forge-env command line."""

import subprocess
import sys

from forge_env.cli import main


def test_list_and_check_through_the_console_script(capsys):
    assert main(["check", "tests/GuessCli-v0"]) == 1
    assert "no environment registered" in capsys.readouterr().err
    import forge_env

    forge_env.register("tests/GuessCli-v0", "tests.guess_env:GuessEnv")
    assert main(["check", "tests/GuessCli-v0", "--kwargs", '{"high": 20}']) == 0
    assert "passes check_env" in capsys.readouterr().out


def test_module_entry_runs():
    result = subprocess.run([sys.executable, "-m", "forge_env.cli", "list"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
