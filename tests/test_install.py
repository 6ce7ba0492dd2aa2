"""The README's install line in a fresh virtual environment, as a new user runs it.

``python -m venv`` then ``pip install "<checkout>" torch==2.13.0``: without the ``hf`` extra,
``rulegraph export`` of a Hugging Face folder fails in one line naming the extra (exit 2); then
``pip install "<checkout>[hf]" torch==2.13.0`` in the same environment, and ``rulegraph export``
of a tiny random-weight GPT-2 folder and ``rulegraph explain`` on the export succeed. The
checkout is installed with its declared dependencies from the package index (one torch install,
shared by both steps: the environment without the extra is the first step of the one with it).

Every command and its output go to ``install.log`` in the test's folder; a failure shows its tail.
Skipped, saying so, when no package index answers.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

import tiny

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"
pytestmark = pytest.mark.install


def _checkout(to: Path) -> Path:
    """The files an install of the checkout reads (pyproject.toml, the README, the package folders
    of ``[tool.setuptools.package-dir]``), copied so that building it leaves the checkout as it was."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = {"rulegraph", *project["tool"]["setuptools"]["package-dir"].values()}
    to.mkdir()
    for name in ("pyproject.toml", project["project"]["readme"]):
        shutil.copy2(ROOT / name, to / name)
    for folder in sorted(folders):
        shutil.copytree(ROOT / folder, to / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return to


class Log:
    """Runs commands, writing each with its output and exit status to one file."""

    def __init__(self, path: Path):
        self.path = path
        self.started = time.monotonic()

    def run(self, *command: str | Path, timeout: float = 900) -> subprocess.CompletedProcess:
        """``command`` run in the log's folder (so that ``python -c`` imports nothing of the checkout)."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        started = time.monotonic()
        done = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=self.path.parent)
        with self.path.open("a") as f:
            f.write(f"$ {' '.join(str(c) for c in command)}\n{done.stdout}{done.stderr}"
                    f"[exit {done.returncode} after {time.monotonic() - started:.1f} s]\n")
        return done

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.path.read_text().splitlines()[-lines:])


#: pip's own words when an index cannot be reached (its retries, the connection errors it names)
UNREACHABLE = re.compile(r"Retrying \(Retry\(|NewConnectionError|ConnectTimeoutError|ProxyError|Temporary failure in "
                         r"name resolution|Network is unreachable|No route to host")
#: pip's network settings for these commands: a few bounded tries, not the configured default's minutes
NETWORK = ("--timeout", "30", "--retries", "2")


def _unreachable(done: subprocess.CompletedProcess) -> str | None:
    """Why pip could not reach a package index, where its output says so (else ``None``)."""
    found = UNREACHABLE.search(done.stdout + done.stderr)
    if found is None:
        return None
    line = next(line for line in (done.stdout + done.stderr).splitlines() if found.group(0) in line)
    return f"no package index reachable: {line.strip()[:300]}"


def _pip(log: Log, python: Path, *arguments: str | Path) -> subprocess.CompletedProcess:
    """``pip ARGUMENTS`` in the environment; the test skips, saying why, where pip cannot reach an index
    and fails, and fails with the log's tail on any other failure."""
    done = log.run(python, "-m", "pip", *arguments, *NETWORK)
    if done.returncode != 0 and _unreachable(done):
        pytest.skip(_unreachable(done))
    assert done.returncode == 0, log.tail()
    return done


def test_a_fresh_environment_installs_the_checkout_and_its_extra_and_exports_and_explains(tmp_path):
    log = Log(tmp_path / "install.log")
    venv = tmp_path / "venv"
    made = log.run(sys.executable, "-m", "venv", venv)
    assert made.returncode == 0, log.tail()
    python, rulegraph = venv / "bin" / "python", venv / "bin" / "rulegraph"
    _pip(log, python, "index", "versions", "safetensors")       # an index answers (else: skipped, saying so)
    checkout = _checkout(tmp_path / "checkout")
    folder = tmp_path / "gpt2"
    tiny.save_causal_lm("gpt2", folder)           # config.json, model.safetensors, tokenizer.json

    # without the extra: the export names it, in one line
    _pip(log, python, "install", "--no-compile", checkout, TORCH)
    refused = log.run(rulegraph, "export", folder, tmp_path / "refused", timeout=300)
    assert refused.returncode == 2, log.tail()
    message = refused.stderr.strip()
    assert len(message.splitlines()) == 1 and 'pip install "rulegraph[hf]"' in message, log.tail()
    assert "Traceback" not in refused.stderr + refused.stdout, log.tail()

    # with it: export the tiny GPT-2 and explain a text on the export
    _pip(log, python, "install", "--no-compile", f"{checkout}[hf]", TORCH)
    exported = log.run(rulegraph, "export", folder, tmp_path / "out", timeout=300)
    assert exported.returncode == 0, log.tail()
    assert (tmp_path / "out" / "model.onnx").is_file() and (tmp_path / "out" / "tokenizer.json").is_file()
    explained = log.run(rulegraph, "explain", tmp_path / "out" / "model.onnx", "-r", "attnlrp", "-t", "w1 w2 w3",
                        "--json", tmp_path / "e.json", timeout=300)
    assert explained.returncode == 0, log.tail()
    assert (tmp_path / "e.json").is_file(), log.tail()
    found = json.loads((tmp_path / "e.json").read_text())
    assert found["tokens"] == ["w1", "w2", "w3"] and len(found["relevance"]["input_ids"]) == 3
    assert not found["conservation"]["residual_flagged"], found["conservation"]
    # the environment's own rulegraph ran, not this checkout's
    where = log.run(python, "-c", "import rulegraph; print(rulegraph.__file__)")
    assert where.stdout.strip().startswith(str(venv)), log.tail()


def test_an_index_that_cannot_be_reached_is_told_apart_from_a_failed_install(tmp_path):
    """pip against a closed port on this machine (no index, no links, no configuration): the reason
    to skip names pip's connection error; a failure with no such words is no reason to skip."""
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
           "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "", "PIP_NO_CACHE_DIR": "1"}
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(tmp_path), "safetensors",
                           *NETWORK], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode != 0
    assert _unreachable(done).startswith("no package index reachable: "), done.stdout + done.stderr
    failed = subprocess.CompletedProcess([], 1, "", "ERROR: Could not find a version that satisfies the requirement x")
    assert _unreachable(failed) is None
