"""examples/load.py's progress: a counter redrawn in place on a terminal,
plain lines elsewhere (a pipe or CI log is never silent for long)."""

from __future__ import annotations

import io
import os
import sys

from helpers import SERVE_TOOLS, require_module

# examples/load.py imports examples/serve.py, which imports the serve extra (see require_module).
for _name in SERVE_TOOLS:
    require_module(_name, "examples/load.py imports examples/serve.py, which needs it", module_level=True)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples.load import _Progress  # noqa: E402


def test_off_a_terminal_plain_lines_then_a_final_one(monkeypatch):
    out = io.StringIO()
    bar = _Progress(10, True, stream=out, tty=False)
    monkeypatch.setattr(_Progress, "LINE_INTERVAL", 0.0)
    bar.update(3)
    bar.update(7)
    bar.update(10, final=True)
    lines = out.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == ["load: 3/10 requests", "load: 7/10 requests", "load: 10/10 requests"]
    assert "\r" not in out.getvalue()
    assert lines[-1].endswith(" s (done)")


def test_off_a_terminal_lines_are_spaced_by_the_interval():
    out = io.StringIO()
    bar = _Progress(None, True, stream=out, tty=False)  # LINE_INTERVAL = 2 s: none due yet
    for done in range(1, 50):
        bar.update(done)
    assert out.getvalue() == ""
    bar.update(50, final=True)
    assert out.getvalue().startswith("load: 50 requests, ") and out.getvalue().count("\n") == 1


def test_on_a_terminal_one_line_redrawn_in_place():
    out = io.StringIO()
    bar = _Progress(4, True, stream=out, tty=True)
    bar.update(1)
    bar.update(4, final=True)
    text = out.getvalue()
    assert text.startswith("\rload: 1/4 requests, ") and "\rload: 4/4 requests, " in text
    assert text.count("\n") == 1 and text.endswith("\n")


def test_disabled_writes_nothing():
    out = io.StringIO()
    bar = _Progress(4, False, stream=out, tty=False)
    bar.update(4, final=True)
    assert out.getvalue() == ""
