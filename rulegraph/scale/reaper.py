"""The processes of a local Ray cluster die with the driver that started it, however it ends.

``ray.init`` starts the cluster's processes as the driver's children; the GCS server and the raylet
die with it (Ray sets their parent-death signal), but the dashboard and runtime-env agents are the
raylet's children and outlive a driver killed with ``kill -9`` (for a minute or more, ~170 MB).
So the driver starts a *reaper* first: a small process of its own session (stdlib only, run as a
script: no torch, no Ray) whose standard input is a pipe from the driver. The driver sends it the
process ids of the cluster it started (:meth:`Reaper.watch`); the reaper adds their descendants as
they appear. When the driver is done it says so (:meth:`Reaper.stop`) and the reaper leaves; when
the pipe closes without that (the driver died), the reaper kills every process it was given, and
their descendants — each checked by its start time, so a reused pid is never touched.

Linux only (``/proc``); elsewhere :meth:`Reaper.start` returns ``None`` and nothing changes.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

DONE = "done"
#: how often the reaper looks for the watched processes' new children (seconds)
POLL = 0.25


def processes() -> dict[int, tuple[int, str]]:
    """pid → (parent pid, start time) of every process, from ``/proc``."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                found[int(entry)] = stat
    return found


def _stat(pid: int) -> tuple[int, str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()          # after "pid (comm) "
    return (int(fields[1]), fields[19]) if len(fields) > 19 and fields[0] != "Z" else None


def descendants(root: int, table: dict[int, tuple[int, str]] | None = None) -> dict[int, str]:
    """pid → start time of every live descendant of ``root``."""
    table = table if table is not None else processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    out, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out[pid] = table[pid][1]
        todo.extend(children.get(pid, []))
    return out


class Reaper:
    """The driver's side: the reaper process and the pipe to it."""

    def __init__(self, process: subprocess.Popen):
        self.process = process

    @classmethod
    def start(cls) -> "Reaper | None":
        if not sys.platform.startswith("linux") or not os.path.isdir("/proc"):
            return None
        process = subprocess.Popen([sys.executable, "-I", "-S", __file__], stdin=subprocess.PIPE,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                                   start_new_session=True, close_fds=True)
        return cls(process)

    def watch(self, root: int | None = None) -> None:
        """Hand the reaper every descendant of ``root`` (default: this process) but itself."""
        mine = descendants(os.getpid() if root is None else root)
        mine.pop(self.process.pid, None)
        self._send("".join(f"{pid} {start}\n" for pid, start in mine.items()))

    def stop(self) -> None:
        """The cluster was shut down: the reaper leaves without killing anything."""
        self._send(DONE + "\n")
        try:
            self.process.stdin.close()
            self.process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()

    def _send(self, text: str) -> None:
        try:
            self.process.stdin.write(text)
            self.process.stdin.flush()
        except (OSError, ValueError):
            pass


def main() -> None:
    """The reaper process (see the module docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)        # the terminal's Ctrl-C is the driver's to handle
    watched: dict[int, str] = {}
    buffer = ""
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], POLL)
        if ready:
            chunk = os.read(sys.stdin.fileno(), 65536).decode()
            if not chunk:
                break                                    # the driver is gone
            buffer += chunk
            *lines, buffer = buffer.split("\n")
            for line in lines:
                if line.strip() == DONE:
                    return
                pid, _, start = line.partition(" ")
                if pid.isdigit():
                    watched[int(pid)] = start.strip()
        table = processes()
        for pid, start in list(watched.items()):        # their children, while they are alive
            if table.get(pid, (0, None))[1] == start:
                watched.update(descendants(pid, table))
    table = processes()
    for pid, start in watched.items():
        if table.get(pid, (0, None))[1] == start:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


if __name__ == "__main__":
    main()
