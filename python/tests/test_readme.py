"""The README's Python example (one engine iteration) runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_engine_iteration_runs():
    text = README.read_text()
    section = text[text.index("\n## Python\n"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert [a.prepopulated_prompt_len for a in scope["admitted"]] == [0, 0]
    assert scope["offsets"].shape[1] == 3
