"""The README's "Write an environment" example runs as written."""

import pathlib
import re


def test_write_an_environment_example_runs():
    text = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
    block = re.search(r"## Write an environment\n\n```python\n(.*?)```", text, re.S).group(1)
    exec(compile(block, "README.md", "exec"), {})


def test_the_submit_example_runs():
    """The example of an environment that ends on a ``submit`` tool (``grade_episode``) runs as written."""
    text = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
    block = re.search(r"An environment that ends on a `submit` tool:\n\n```python\n(.*?)```", text, re.S).group(1)
    exec(compile(block, "README.md", "exec"), {})
