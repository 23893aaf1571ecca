"""The README's and docs/' Python snippets run as written, each on its own
in a fresh interpreter (no names from another snippet), and the Quickstart
is the two commands CI runs."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

from helpers import child_env

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _snippets() -> list:
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            line = text.count("\n", 0, m.start()) + 1
            out.append(pytest.param(m.group(1), id=f"{page.relative_to(ROOT)}:{line}"))
    return out


SNIPPETS = _snippets()


def test_there_are_snippets_to_run():
    assert len([p for p in SNIPPETS if p.id.startswith("README.md:")]) >= 3


@pytest.mark.thread_unsafe(reason="each runs a fresh interpreter that imports JAX: 8 at once only repeat it")
@pytest.mark.parametrize("code", SNIPPETS)
def test_snippet_runs_on_its_own(code, tmp_path):
    pytest.importorskip("jax")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=child_env())
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"


def test_quickstart_is_the_two_commands():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None
    commands = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert commands == ["bash dev.sh demo", "bash dev.sh test"]
    # CI runs the README's test command and its main job.
    ci = (ROOT / ".ci" / "run").read_text()
    assert "\nbash dev.sh test\n" in ci and "\nbash dev.sh demo\n" in ci


def _relative_links() -> list:
    out = []
    for page in PAGES:
        for m in re.finditer(r"\]\(([^)#\s]+)(#[^)\s]*)?\)", page.read_text()):
            target = m.group(1)
            if "://" not in target and not target.startswith("mailto:"):
                out.append(pytest.param(page, target, id=f"{page.relative_to(ROOT)}->{target}"))
    return out


def test_there_are_relative_links_to_check():
    assert any(target == "docs/serving.md" for _, target in (p.values for p in _relative_links()))


@pytest.mark.parametrize(("page", "target"), _relative_links())
def test_relative_link_leads_to_a_file(page, target):
    assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links {target}, which does not exist"
