"""The shell commands of the README and docs/ run as written from a fresh clone after the Quickstart
(``bash dev.sh demo``, ``bash dev.sh test``, which build ``.venv``); tests/test_docs.py does the
Python snippets. Issue 29: a plain ``python examples/serve.py`` in the docs failed with a bare
``ModuleNotFoundError``, and ``pip install 'ftjit[serve]'`` fails, ftjit not being on PyPI.

The commands are every line of the ```bash, ```sh and ```console blocks, and every inline `code`
span that starts like a command (``python``, ``pip``, ``bash``, ``source``, a ``.../bin/python``,
optionally after ``VAR=value`` assignments); ``&&``, ``;`` and ``|`` split a line into commands.

Checked, for every command, without running it:
  - a Python or pip of the clone is ``.venv/bin/...`` or ``.venv-ft/bin/...`` (the environments
    dev.sh makes), or a plain ``python``/``pip`` after ``source .venv/bin/activate`` in the same
    block; a plain one is allowed only on ``/path/to/ftjit`` paths, git URLs and wheels (the clone
    or ftjit, from an environment of the reader's own), and for pip packages other than ftjit;
  - each script path exists (``/path/to/ftjit`` standing for the clone), each ``-m`` module exists in
    the clone or is installed in this test's environment;
  - ``bash SCRIPT`` exists; ``bash dev.sh CMD``: CMD is a command of dev.sh's ``case``, and its
    ``--flags`` are on dev.sh's usage line for CMD (for demo, stress and bench: see --help below);
  - ``pip install``/``pip wheel`` never asks an index for ftjit by name: ftjit comes from a path, a
    git URL or a wheel, and an ``[extra]`` is one that pyproject.toml defines;
  - every fenced block names its language, so that no shell block goes unchecked as plain text.

Run for real, each in a subprocess with a timeout, with this test's interpreter (the venv's under
dev.sh) and the clone's root as ``cwd``:
  - ``--help`` of each documented script and ``-m`` module of the clone that parses its arguments
    with argparse (examples/demo.py, serve.py, load.py, ``-m stress``, ``-m bench``), and every
    ``--flag`` the docs give it, directly or through ``bash dev.sh demo/stress/bench``, must be in
    that help; a few seconds each (they import JAX);
  - the docs/serving.md block as written, with the port that ``--port 0`` picked instead of 8000:
    the server in the background, the load generator (2000 requests, a few seconds; exit code 0),
    ``curl`` when it is installed, and ``/metrics`` fetched again here; then SIGTERM, exit code 0.
    The server is stopped in a ``finally`` (killed if it has not exited 60 s after SIGTERM), so none
    is left behind. This needs loopback TCP.

Only checked, never run: ``bash dev.sh ...`` (they build, and run for minutes), ``pip`` (a build
each), the plain-``python`` commands for an environment of the reader's own, ``-m
stress.mutation_check`` (no ``--help``: it starts at once and rebuilds the core for minutes), and
other tools' commands (uv, conda, apt, ...).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import tomllib
import urllib.request

import pytest

from helpers import SERVE_TOOLS, require_module, require_tcp

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
#: The environments dev.sh makes (.venv; .venv-ft for FTJIT_PYTHON=ft); the docs' Pythons are theirs.
VENVS = (".venv", ".venv-ft")
ACTIVATE = tuple(f"{venv}/bin/activate" for venv in VENVS)
#: In a documented path, the clone as seen from an environment of the reader's own.
CLONE_PLACEHOLDER = "/path/to/ftjit"
PLAIN_PYTHON = re.compile(r"python3?(\.\d+t?)?")
PLAIN_PIP = re.compile(r"pip3?")
SEPARATORS = {"&&", "||", ";", "|", "&"}
#: dev.sh commands that run a script of the clone: their flags are that script's.
DEV_SH_RUNS = {"demo": ["examples/demo.py"], "stress": ["-m", "stress"], "bench": ["-m", "bench"]}


@dataclasses.dataclass(frozen=True)
class Command:
    where: str  #: page:line
    words: tuple[str, ...]  #: after the VAR=value assignments
    activated: bool  #: a `source .venv/bin/activate` came earlier in the same block
    error: str | None = None  #: why the line could not be read as shell words

    def __str__(self) -> str:
        return " ".join(self.words)


def _split(text: str) -> list[list[str]]:
    """The commands of one shell line, each a list of words, comments dropped."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in SEPARATORS:
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def _strip_assignments(words: list[str]) -> list[str]:
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", words[0]):
        words = words[1:]
    return words


def _is_python(word: str) -> bool:
    return bool(PLAIN_PYTHON.fullmatch(word)) or bool(re.search(r"/bin/python3?(\.\d+t?)?$", word))


def _is_pip(word: str) -> bool:
    return bool(PLAIN_PIP.fullmatch(word)) or bool(re.search(r"/bin/pip3?$", word))


def _starts_like_a_command(words: list[str]) -> bool:
    """An inline span is a command if it starts with one of ours and has an argument."""
    return len(words) >= 2 and (_is_python(words[0]) or _is_pip(words[0]) or words[0] in ("bash", "source", "."))


def _commands() -> list[Command]:
    out: list[Command] = []
    for page in PAGES:
        text, name = page.read_text(), page.relative_to(ROOT)
        fences = list(re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M))
        for m in fences:
            if m.group(1) not in SHELL_LANGUAGES:
                continue
            activated = False
            first_line = text.count("\n", 0, m.start()) + 2
            for offset, line in enumerate(m.group(2).splitlines()):
                if m.group(1) == "console":  # commands after a "$ " prompt; the rest is their output
                    if not line.startswith("$ "):
                        continue
                    line = line[2:]
                where = f"{name}:{first_line + offset}"
                try:
                    commands = [_strip_assignments(words) for words in _split(line)]
                except ValueError as exc:  # unbalanced quotes: reported by test_command_runs_from_a_fresh_clone
                    out.append(Command(where, (line,), activated, error=str(exc)))
                    continue
                for words in commands:
                    if len(words) >= 2 and words[0] in ("source", ".") and words[1] in ACTIVATE:
                        activated = True
                    if words:
                        out.append(Command(where, tuple(words), activated))
        prose = text
        for m in reversed(fences):  # blank the fenced blocks out, keeping line numbers
            prose = prose[: m.start()] + re.sub(r"[^\n]", " ", m.group(0)) + prose[m.end() :]
        for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", prose):
            span = " ".join(m.group(1).split())  # a span may wrap onto the next line
            try:
                commands = [_strip_assignments(words) for words in _split(span)]
            except ValueError:  # unbalanced quotes: not a shell command
                continue
            if commands and _starts_like_a_command(commands[0]):
                line = prose.count("\n", 0, m.start()) + 1
                out.extend(Command(f"{name}:{line}", tuple(words), False) for words in commands if words)
    return out


COMMANDS = _commands()


def _dev_sh_commands() -> set[str]:
    case = (ROOT / "dev.sh").read_text().split('case "$cmd" in', 1)[1]
    return set(re.findall(r"^  ([a-z][a-z-]*)\)", case, re.M))


def _pyproject_extras() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def _python_target(words: tuple[str, ...]) -> list[str] | None:
    """For `python [options] TARGET args...`: ["path/script.py"] or ["-m", "module"]; None for -c or none."""
    i = 1
    while i < len(words):
        word = words[i]
        if word == "-m" and i + 1 < len(words):
            return ["-m", words[i + 1]]
        if word == "-c":
            return None
        if word in ("-X", "-W"):
            i += 2
            continue
        if word.startswith("-"):
            i += 1
            continue
        return [word]
    return None


def _target_args(words: tuple[str, ...], target: list[str]) -> tuple[str, ...]:
    start = words.index(target[-1]) + 1
    return words[start:]


def _clone_path(path: str) -> pathlib.Path:
    return ROOT / path[len(CLONE_PLACEHOLDER) + 1 :] if path.startswith(CLONE_PLACEHOLDER + "/") else ROOT / path


def _module_file(module: str) -> pathlib.Path | None:
    base = ROOT / module.replace(".", "/")
    for candidate in (base / "__main__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


#: pip options whose value is the next word (-e's is a requirement: kept).
PIP_VALUE_OPTIONS = {"-w", "--wheel-dir", "-r", "--requirement", "-c", "--constraint", "-t", "--target",
                     "--prefix", "--root", "-i", "--index-url", "--extra-index-url", "-f", "--find-links"}  # fmt: skip


def _pip_requirements(words: tuple[str, ...]) -> list[str]:
    """The requirements of `pip install/wheel ...` (paths, URLs, names), options and their values left out."""
    out, skip = [], False
    for word in words[2:]:
        if skip:
            skip = False
        elif word in PIP_VALUE_OPTIONS:
            skip = True
        elif not word.startswith("-"):
            out.append(word)
    return out


def _from_elsewhere(word: str) -> bool:
    """A path or URL that means "the clone, or ftjit, from an environment of the reader's own"."""
    return word.startswith(CLONE_PLACEHOLDER) or "://" in word or word.endswith(".whl")


def _interpreter_problem(command: Command, kind: str) -> str | None:
    """Why the Python or pip that starts `command` is not one a fresh clone has, or None."""
    program = command.words[0]
    if program in {f"{venv}/bin/{kind}" for venv in VENVS}:
        return None
    plain = bool(PLAIN_PYTHON.fullmatch(program) or PLAIN_PIP.fullmatch(program))
    if plain and command.activated:
        return None
    if plain and kind == "python":
        target = _python_target(command.words)
        if target and target[0] != "-m" and target[0].startswith(CLONE_PLACEHOLDER):
            return None  # a script of the clone, run by the reader's own environment
        if target and target[0] == "-m" and any(w.startswith(CLONE_PLACEHOLDER) for w in command.words):
            return None  # a tool of the reader's own environment, run on the clone (pytest on its tests)
    if plain and kind == "pip" and command.words[1:2] in (("install",), ("wheel",)):
        requirements = _pip_requirements(command.words)
        if requirements and all(_from_elsewhere(r) or "ftjit" not in r for r in requirements):
            return None  # into the reader's own environment: ftjit from the clone, a URL or a wheel, or others
    return (f"{command.where}: `{command}` runs a plain {program}, which has no ftjit in a fresh clone: "
            f"write .venv/bin/{kind} (or `source .venv/bin/activate` earlier in the block), or give "
            f"{CLONE_PLACEHOLDER}/... paths for an environment of the reader's own")  # fmt: skip


def _problems(command: Command) -> list[str]:
    words, where, problems = command.words, command.where, []
    if command.error is not None:
        return [f"{where}: `{words[0]}` is not a shell line that can be read ({command.error})"]
    program = words[0]
    if _is_python(program):
        problem = _interpreter_problem(command, "python")
        if problem:
            problems.append(problem)
        target = _python_target(words)
        if target and target[0] == "-m":
            if _module_file(target[1]) is None and importlib.util.find_spec(target[1].split(".")[0]) is None:
                problems.append(f"{where}: `{command}`: no module {target[1]} in the clone or installed")
        elif target and not _clone_path(target[0]).is_file():
            problems.append(f"{where}: `{command}`: no file {target[0]} in the clone")
    elif _is_pip(program):
        problem = _interpreter_problem(command, "pip")
        if problem:
            problems.append(problem)
        if words[1:2] in (("install",), ("wheel",)):
            for requirement in _pip_requirements(words):
                name = re.split(r"[\[ @<>=!~]", requirement.rstrip("/").rsplit("/", 1)[-1], maxsplit=1)[0]
                if name == "ftjit" and not ("/" in requirement or " @ " in requirement or requirement.endswith(".whl")):
                    problems.append(f"{where}: `{command}` asks the package index for ftjit, which is not on "
                                    f"PyPI: install it from a path ({CLONE_PLACEHOLDER}), a git URL or a wheel")  # fmt: skip
                if requirement.startswith((CLONE_PLACEHOLDER, ".")):
                    path, _, extras = requirement.partition("[")
                    if not _clone_path(path).exists() and path not in (".", CLONE_PLACEHOLDER):
                        problems.append(f"{where}: `{command}`: {path} is not in the clone")
                    unknown = {e.strip() for e in extras.rstrip("]").split(",") if e.strip()} - _pyproject_extras()
                    if unknown:
                        problems.append(f"{where}: `{command}`: pyproject.toml defines no extra {sorted(unknown)}")
    elif program == "bash" and len(words) > 1:
        script = words[1]
        if not _clone_path(script).is_file():
            problems.append(f"{where}: `{command}`: no file {script} in the clone")
        elif script == "dev.sh" and len(words) > 2:
            sub, flags = words[2], [w.split("=")[0] for w in words[3:] if w.startswith("--")]
            if sub not in _dev_sh_commands():
                problems.append(f"{where}: `{command}`: dev.sh has no command {sub!r} (it has {sorted(_dev_sh_commands())})")
            elif sub not in DEV_SH_RUNS:
                usage = [line for line in (ROOT / "dev.sh").read_text().splitlines() if f"bash dev.sh {sub} " in line]
                problems += [f"{where}: `{command}`: {flag} is not on dev.sh's usage line for {sub}"
                             for flag in flags if sub != "test" and not any(flag in line for line in usage)]  # fmt: skip
    elif program in ("source", "."):
        if len(words) < 2 or words[1] not in ACTIVATE:
            problems.append(f"{where}: `{command}`: source only an environment dev.sh makes: {' or '.join(VENVS)}")
    return problems


def test_the_docs_have_shell_commands_to_check():
    documented = {(c.where.split(":")[0], str(c)) for c in COMMANDS}
    assert ("README.md", "bash dev.sh demo") in documented
    assert ("docs/serving.md", ".venv/bin/python examples/serve.py --port 8000") in documented
    assert any(page == "docs/development.md" and cmd.startswith(".venv/bin/python -m stress") for page, cmd in documented)


@pytest.mark.parametrize("command", COMMANDS, ids=[f"{c.where} {c}" for c in COMMANDS])
def test_command_runs_from_a_fresh_clone(command):
    assert _problems(command) == []


def _check(line: str, activated: bool = False) -> list[str]:
    return [p.split(": ", 1)[1] for words in _split(line)
            for p in _problems(Command("x.md:1", tuple(_strip_assignments(words)), activated))]  # fmt: skip


def test_the_checks_catch_what_issue_29_found():
    """The two commands a newcomer tripped on are refused, with what to write instead; their fixed forms pass."""
    assert _check("python examples/serve.py --port 8000") == [
        "`python examples/serve.py --port 8000` runs a plain python, which has no ftjit in a fresh clone: write "
        ".venv/bin/python (or `source .venv/bin/activate` earlier in the block), or give /path/to/ftjit/... paths "
        "for an environment of the reader's own"
    ]
    assert _check("pip install 'ftjit[serve]'") == [
        "`pip install ftjit[serve]` runs a plain pip, which has no ftjit in a fresh clone: write .venv/bin/pip (or "
        "`source .venv/bin/activate` earlier in the block), or give /path/to/ftjit/... paths for an environment "
        "of the reader's own",
        "`pip install ftjit[serve]` asks the package index for ftjit, which is not on PyPI: install it from a "
        "path (/path/to/ftjit), a git URL or a wheel",
    ]
    assert _check("pip install '/path/to/ftjit[nosuch]'") == [
        "`pip install /path/to/ftjit[nosuch]`: pyproject.toml defines no extra ['nosuch']"
    ]
    assert _check(".venv/bin/python examples/nosuch.py") == ["`.venv/bin/python examples/nosuch.py`: no file examples/nosuch.py in the clone"]
    assert _check(".venv/bin/python -m nosuch") == ["`.venv/bin/python -m nosuch`: no module nosuch in the clone or installed"]
    assert _check("bash dev.sh nosuch") == [
        f"`bash dev.sh nosuch`: dev.sh has no command 'nosuch' (it has {sorted(_dev_sh_commands())})"
    ]
    assert _check("bash dev.sh ft-python --nosuch") == ["`bash dev.sh ft-python --nosuch`: --nosuch is not on dev.sh's usage line for ft-python"]
    assert _check("source venv/bin/activate") == ["`source venv/bin/activate`: source only an environment dev.sh makes: .venv or .venv-ft"]
    for fine in (".venv/bin/python examples/serve.py --port 8000", ".venv-ft/bin/python -m stress --quick",
                 "pip install '/path/to/ftjit[serve]' && python /path/to/ftjit/examples/serve.py --port 8000",
                 "pip wheel --no-deps /path/to/ftjit -w dist/ && pip install dist/ftjit-*.whl",
                 'pip install "ftjit @ git+https://<host>/<owner>/ftjit.git"', "pip install --only-binary=:all: jax numpy",
                 "FTJIT_PYTHON=ft bash dev.sh stress --quick", "bash dev.sh test -k cache"):  # fmt: skip
        assert _check(fine) == [], fine
    assert _check("python -m stress --quick", activated=True) == []


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_fenced_block_names_its_language(page):
    text = page.read_text()
    bare = [text.count("\n", 0, m.start()) + 1 for m in re.finditer(r"^```(\w*)\n.*?^```", text, re.S | re.M)
            if not m.group(1)]  # fmt: skip
    assert bare == [], f"{page.relative_to(ROOT)}: fenced blocks without a language at lines {bare} (bash? text?)"


def _documented_targets() -> dict[tuple[str, ...], set[str]]:
    """Each documented script or -m module of the clone, with the --flags the docs give it."""
    flags: dict[tuple[str, ...], set[str]] = {}
    for command in COMMANDS:
        words = command.words
        if _is_python(words[0]):
            target = _python_target(words)
            if target is None:
                continue
            args = _target_args(words, target)
            if target[0] != "-m":
                target = [str(_clone_path(target[0]).relative_to(ROOT))]
            elif _module_file(target[1]) is None:
                continue  # an installed module (pytest, pip): not the clone's
        elif words[:2] == ("bash", "dev.sh") and len(words) > 2 and words[2] in DEV_SH_RUNS:
            target, args = DEV_SH_RUNS[words[2]], words[3:]
        else:
            continue
        flags.setdefault(tuple(target), set()).update(a.split("=")[0] for a in args if a.startswith("--"))
    return flags


def _parses_arguments(target: tuple[str, ...]) -> bool:
    """Whether the script or module takes --help (argparse), rather than starting its work at once."""
    path = _module_file(target[1]) if target[0] == "-m" else ROOT / target[0]
    assert path is not None
    source = path.read_text()
    if path.name == "__main__.py":  # python -m stress: stress/__main__.py runs stress/cli.py's main
        source += "".join(p.read_text() for p in path.parent.glob("cli.py"))
    return "argparse" in source and ".parse_args(" in source


TARGETS = _documented_targets()
HELP_TARGETS = {target: flags for target, flags in TARGETS.items() if _parses_arguments(target)}


def test_only_the_long_one_without_help_is_never_run():
    assert {("examples/serve.py",), ("examples/load.py",), ("-m", "stress")} <= set(HELP_TARGETS)
    assert sorted(set(TARGETS) - set(HELP_TARGETS)) == [("-m", "stress.mutation_check")]


TPU_VM_WARNING = "Transparent hugepages are not enabled"


@pytest.mark.thread_unsafe(reason="starts a Python process that imports JAX per documented script: 8 at once only repeat it")
@pytest.mark.parametrize(("target", "flags"), [pytest.param(list(t), sorted(f), id=" ".join(t))
                                                for t, f in sorted(HELP_TARGETS.items())])  # fmt: skip
def test_documented_script_answers_help_with_the_documented_flags(target, flags):
    # On a TPU machine JAX's import warns about the VM's hugepage setting, on stderr: not the script's output.
    quiet = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), f"ignore:{TPU_VM_WARNING}:UserWarning"]))
    done = subprocess.run([sys.executable, *target, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONWARNINGS": quiet})  # fmt: skip
    missing = re.search(r"^ModuleNotFoundError: No module named '(\w+)'$", done.stderr, re.M)
    if done.returncode != 0 and missing and missing.group(1) in SERVE_TOOLS:
        # Fails the test, naming the tool, unless FTJIT_TEST_ACCELERATOR=1 (a machine that cannot have it).
        require_module(missing.group(1), f"{' '.join(target)} --help needs it: examples/serve.py imports it")
    assert (done.returncode, done.stderr) == (0, ""), done.stdout + done.stderr
    assert done.stdout.startswith("usage: ")
    assert [f for f in flags if not re.search(rf"(^|[\s\[,]){re.escape(f)}\b", done.stdout)] == []


def _serving_block() -> list[str]:
    text = (ROOT / "docs" / "serving.md").read_text()
    block = re.search(r"^```bash\n(.*?)^```", text, re.S | re.M)
    assert block is not None
    return [" ".join(words) for line in block.group(1).splitlines() for words in _split(line)]


@pytest.mark.thread_unsafe(reason="starts a server process on a port and loads it")
@pytest.mark.timeout(300)
def test_the_serving_block_runs_as_written():
    require_tcp("serving.md's block (a server on a port)")
    lines = _serving_block()
    assert lines == [
        ".venv/bin/python examples/serve.py --port 8000",
        ".venv/bin/python examples/load.py --port 8000 --threads 8 --requests 2000",
        "curl -s localhost:8000/metrics",
    ]
    python = sys.executable  # the venv's under dev.sh (.venv, or .venv-ft for FTJIT_PYTHON=ft)
    serve = shlex.split(lines[0].replace("--port 8000", "--port 0"))[1:]
    server = subprocess.Popen([python, *serve], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output: list[str] = []
    listening = threading.Event()

    def read() -> None:
        assert server.stdout is not None
        for line in server.stdout:
            output.append(line)
            if line.startswith("serving on http://127.0.0.1:"):
                listening.set()
        listening.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert listening.wait(180) and server.poll() is None, "".join(output)
        port = next(line for line in output if line.startswith("serving on")).strip().rsplit(":", 1)[1]
        load = shlex.split(lines[1].replace("8000", port))[1:]
        done = subprocess.run([python, *load], cwd=ROOT, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        assert re.search(r"^requests +2000  sent, answered or not$", done.stdout, re.M), done.stdout
        assert re.search(r"^wrong answers +0  ", done.stdout, re.M), done.stdout
        expected = 'ftjit_compiles_total{function="mlp"} 6.0'
        if shutil.which("curl"):
            curl = subprocess.run(shlex.split(lines[2].replace("8000", port)), capture_output=True, text=True, timeout=60)
            assert curl.returncode == 0 and expected in curl.stdout.splitlines(), curl.stdout + curl.stderr
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as answer:
            assert expected in answer.read().decode().splitlines()
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            code = server.wait()
        reader.join(60)
    assert code == 0, "".join(output)
    assert "".join(output).rstrip().endswith("server stopped")
