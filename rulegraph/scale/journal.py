"""The driver's record of finished rows: an append-only JSON-lines file, flushed and synced
after every task, so that a run stopped at any moment (Ctrl-C, a lost machine) resumes from
what is written. A last line cut short by the stop (no line end) is dropped, and cut from the
file on a repairing read (its rows are written again); any other line that is not a row (a JSON object with an ``example``
number) is an error naming the file and line: the journal was changed by something else."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from ..errors import InputError
from ..files import append_lines, refuse_link, replacing


class Journal:
    def __init__(self, path: Path):
        self.path = Path(path)

    def read(self, repair: bool = False) -> list[dict]:
        """The rows written so far; ``repair``: cut a last line left incomplete by a stop."""
        if not self.path.exists():
            return []
        refuse_link(self.path, "the journal")
        rows, good = [], 0
        with self.path.open("rb") as handle:
            for number, line in enumerate(handle, 1):
                if not line.endswith(b"\n"):
                    break                   # the last line, cut short by a stop (it is written again)
                try:
                    row = json.loads(line)
                except ValueError:
                    raise InputError(f"{self.path}:{number}: not a JSON row; the journal was changed by something "
                                     "other than rulegraph: pass --force to start over") from None
                if not isinstance(row, dict) or not isinstance(row.get("example"), int) or \
                        isinstance(row.get("example"), bool):
                    raise InputError(f"{self.path}:{number}: not a row rulegraph wrote (a JSON object with an "
                                     "`example` number); pass --force to start over")
                rows.append(row)
                good += len(line)
        if repair and good < self.path.stat().st_size:
            with self.path.open("r+b") as handle:
                handle.truncate(good)
        return rows

    def append(self, rows: Iterable[dict]) -> None:
        append_lines(self.path, (json.dumps(row) + "\n" for row in rows), "the journal")


def write_parquet(rows: list[dict], path: Path) -> Path:
    """``rows`` (dicts with the same keys; ``None`` where absent) as one Parquet file, written whole."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    keys = list(dict.fromkeys(k for row in rows for k in row))
    table = pa.Table.from_pylist([{k: row.get(k) for k in keys} for row in rows])
    with replacing(path, path.name) as staged:
        pq.write_table(table, staged)
    return path
