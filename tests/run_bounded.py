"""Run cases under a memory cap (RLIMIT_AS) and a time limit per case, in this one process (torch is
imported once), and report, per case, what it returned or raised, its output, its seconds, and
whether the user's folder changed. Used by ``tests/cli/test_hostile_inputs.py`` (command lines,
through ``rulegraph.cli.main``) and ``tests/test_hostile_api.py`` (calls of the Python API) as

    python run_bounded.py CASES.json RESULTS.json MEMORY_BYTES SECONDS_PER_CASE

CASES.json: ``{"folder": …, "names": {…}, "cases": [{"id": …, "argv": […]} | {"id": …, "call":
"module:function", "out": …}, …]}``; a call gets ``(names, out)``."""
from __future__ import annotations

import contextlib
import importlib
import io
import json
import resource
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


class Timeout(BaseException):
    """Past the case's time limit (a BaseException: the command line's own handlers do not catch it)."""


def _alarm(*_):
    raise Timeout


def _run(case: dict, names: dict) -> tuple[object, str]:
    """(exit code, or the exception's type name, or ``"returned"``; the exception's message)."""
    if "argv" in case:
        from rulegraph.cli import main as cli
        return cli(case["argv"]), ""
    module, _, function = case["call"].partition(":")
    try:
        getattr(importlib.import_module(module), function)(names, Path(case["out"]))
    except Exception as exc:  # noqa: BLE001 — what the API raised is the result
        return type(exc).__name__, str(exc)
    return "returned", ""


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    memory, seconds = int(sys.argv[3]), int(sys.argv[4])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    signal.signal(signal.SIGALRM, _alarm)
    from hostile import digest
    folder = Path(spec["folder"])
    results = {}
    for case in spec["cases"]:
        before = digest(folder)
        buffer = io.StringIO()
        started = time.perf_counter()
        signal.alarm(seconds)
        message = ""
        try:
            with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
                code, message = _run(case, spec.get("names", {}))
        except Timeout:
            code = "timeout"
        except MemoryError:
            code = "memory"
        finally:
            signal.alarm(0)
        after = digest(folder)
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        results[case["id"]] = {"code": code, "message": message, "output": buffer.getvalue(),
                               "seconds": time.perf_counter() - started, "changed": changed}
        Path(sys.argv[2]).write_text(json.dumps(results))
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
