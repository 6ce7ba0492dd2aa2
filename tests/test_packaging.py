"""The package as a wheel: built from the project's own files, it holds every subpackage and the
shipped rule sets, and a process that imports rulegraph from the wheel (not from this checkout)
imports every module and runs the command line's smoke cases."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_holds_every_subpackage_and_runs_the_command_line(tmp_path, bert_onnx):
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(ROOT)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    wheel = next((tmp_path / "dist").glob("rulegraph-*.whl"))
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
        names = set(archive.namelist())
    packages = {f"rulegraph/{p.parent.relative_to(ROOT / 'rulegraph').as_posix()}/__init__.py".replace("/./", "/")
                for p in (ROOT / "rulegraph").rglob("__init__.py")}
    expected = {*packages, "rulegraph/exporters/__init__.py",
                *(f"rulegraph/rules/{p.name}" for p in (ROOT / "rules").glob("*.yaml"))}
    assert expected <= names, f"missing from the wheel: {sorted(expected - names)}"
    code = f"""
import importlib, pkgutil, sys
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path.insert(0, {str(site)!r})
import rulegraph
assert rulegraph.__file__.startswith({str(site)!r}), rulegraph.__file__
for module in pkgutil.walk_packages(rulegraph.__path__, "rulegraph."):
    if not module.name.endswith(".__main__"):          # runs the command line when imported
        importlib.import_module(module.name)
from rulegraph.cli import main
assert main(["rules"]) == 0
assert main(["methods"]) == 0
assert main(["check", {str(bert_onnx)!r}, "-r", "lrp-ah-ln"]) == 0
assert main(["explain", {str(bert_onnx)!r}, "-r", "attnlrp", "-t", "w1 w2 w3"]) == 0
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
