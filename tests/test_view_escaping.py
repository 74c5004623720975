"""``forge-env view`` on a trajectories file from elsewhere: every field is text on the page, never markup."""

import json

from agents.cli import main
from agents.trajectory import Trajectory, Turn

SCRIPT = "<script>alert(1)</script>"


def test_non_string_and_hostile_fields_are_escaped(tmp_path):
    trajectory = Trajectory(episode_id="e0", token_ids=[72, 105, 33], loss_mask=[0, 1, 1], logprobs=[0.0, -1.0, -1.0],
                            turns=[Turn(prompt_start=0, gen_start=1, gen_end=3, policy_version=0, finish_reason="stop")])
    record = trajectory.to_dict()
    record["turns"][0]["policy_version"] = SCRIPT  # JSON allows any type here; the page must not trust it
    record["turns"][0]["finish_reason"] = {"<marquee>": 1}
    record["reward"] = "<img src=x onerror=alert(2)>"
    record["episode_id"] = 12
    record["env_id"] = ["<u>x"]
    path = tmp_path / "foreign.jsonl"
    path.write_text(json.dumps(record) + "\n")
    assert main(["view", str(path)]) == 0
    page = (tmp_path / "foreign.html").read_text()
    assert page.count("class='episode'") == 1
    for markup in (SCRIPT, "<img", "<marquee", "<u>"):
        assert markup not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
