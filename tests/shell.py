"""Run ``rulegraph`` as a user types it: the installed entry point in a child process, its output
logged to files, or on a pseudo-terminal (where rich draws live bars and colours)."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

#: the console script ``pip install`` made beside this Python, else ``python -m rulegraph.cli``
ENTRY = [str(Path(sys.executable).parent / "rulegraph")] if (Path(sys.executable).parent / "rulegraph").is_file() \
    else [sys.executable, "-m", "rulegraph.cli"]


@dataclass
class Ran:
    code: int
    out: str            # standard output (on a terminal: both streams, as the user saw them)
    err: str

    def ok(self) -> None:
        """Exit 0 and no internal error, or the whole output in the failure."""
        assert self.code == 0 and "internal error" not in self.out + self.err, \
            f"exit {self.code}\n--- stdout\n{self.out}\n--- stderr\n{self.err}"


def environment() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "120"}
    env.pop("RULEGRAPH_DEBUG", None)
    return env


def rulegraph(args: list[str], cwd: Path, *, timeout: float = 300) -> Ran:
    """``rulegraph ARGS`` in ``cwd``, standard output and error each logged to a file there."""
    logs = Path(cwd) / ".logs"
    logs.mkdir(exist_ok=True)
    n = len(list(logs.iterdir())) // 2
    out, err = logs / f"{n}.out", logs / f"{n}.err"
    with out.open("wb") as o, err.open("wb") as e:
        code = subprocess.run([*ENTRY, *map(str, args)], cwd=cwd, stdin=subprocess.DEVNULL, stdout=o, stderr=e,
                              env=environment(), timeout=timeout).returncode
    return Ran(code, out.read_text(errors="replace"), err.read_text(errors="replace"))


def on_terminal(args: list[str], cwd: Path, *, timeout: float = 300) -> Ran:
    """``rulegraph ARGS`` in ``cwd`` with a pseudo-terminal for its standard input, output and error."""
    import pty
    import select
    import time
    leader, follower = pty.openpty()
    child = subprocess.Popen([*ENTRY, *map(str, args)], cwd=cwd, stdin=follower, stdout=follower, stderr=follower,
                             env={**environment(), "TERM": "xterm-256color"}, close_fds=True)
    os.close(follower)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:         # the child closed the terminal
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            elif child.poll() is not None:
                break
        else:
            child.kill()
        code = child.wait(timeout=30)
    finally:
        os.close(leader)
    text = b"".join(chunks).decode(errors="replace")
    return Ran(code, text, "")
