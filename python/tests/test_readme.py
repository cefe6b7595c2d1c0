"""The Python example of docs/python.md (one engine iteration) runs as written."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "python.md"


def test_readme_engine_iteration_runs():
    text = DOC.read_text()
    section = text[text.index("\n## One engine iteration\n"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope: dict = {}
    exec(compile(code, "docs/python.md", "exec"), scope)
    assert [a.prepopulated_prompt_len for a in scope["admitted"]] == [0, 0]
    assert scope["offsets"].shape[1] == 3
