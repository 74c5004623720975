"""The forge-env command line."""

import subprocess
import sys

from agents.cli import main


def test_list_and_check_through_the_console_script(capsys):
    assert main(["check", "tests/GuessCli-v0"]) == 1
    assert "no environment registered" in capsys.readouterr().err
    import forge_env

    forge_env.register("tests/GuessCli-v0", "tests.guess_env:GuessEnv")
    assert main(["check", "tests/GuessCli-v0", "--kwargs", '{"high": 20}']) == 0
    assert "passes check_env" in capsys.readouterr().out


def test_module_entry_runs():
    result = subprocess.run([sys.executable, "-m", "agents.cli", "list"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_rollout_and_view_commands(tmp_path):
    out = tmp_path / "episodes.jsonl"
    code = main(["rollout", "forge_env/Arithmetic-v0", "--n", "2", "--group-size", "2", "--out", str(out),
                 "--max-tokens", "8", "--seed", "3"])
    assert code == 0
    from agents.trajectory import read_jsonl

    trajectories = read_jsonl(str(out))
    assert len(trajectories) == 2 and {t.group_id for t in trajectories} == {"task3"}
    assert main(["view", str(out)]) == 0
    page = (tmp_path / "episodes.html").read_text()
    assert page.count("class='episode'") == 2


def test_rollout_rejects_bad_arguments(tmp_path, capsys):
    assert main(["rollout", "forge_env/Arithmetic-v0", "--n", "3", "--group-size", "2", "--out", "x"]) == 1
    assert "multiple of --group-size" in capsys.readouterr().err
    assert main(["rollout", "forge_env/Arithmetc-v0", "--out", str(tmp_path / "x.jsonl")]) == 1
    assert "Did you mean ['forge_env/Arithmetic-v0'" in capsys.readouterr().err
