"""The driver's record of finished rows: an append-only JSON-lines file, flushed and synced
after every task, so that a run stopped at any moment (Ctrl-C, a lost machine) resumes from
what is written. A line cut short by the stop is dropped (and cut from the file) on reading."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable


class Journal:
    def __init__(self, path: Path):
        self.path = Path(path)

    def read(self, repair: bool = False) -> list[dict]:
        """The rows written so far; ``repair``: cut a last line left incomplete by a stop."""
        if not self.path.exists():
            return []
        rows, good = [], 0
        with self.path.open("rb") as handle:
            for line in handle:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    break
                good += len(line)
        if repair and good < self.path.stat().st_size:
            with self.path.open("r+b") as handle:
                handle.truncate(good)
        return rows

    def append(self, rows: Iterable[dict]) -> None:
        with self.path.open("a", encoding="utf-8") as sink:
            for row in rows:
                sink.write(json.dumps(row) + "\n")
            sink.flush()
            os.fsync(sink.fileno())


def write_parquet(rows: list[dict], path: Path) -> Path:
    """``rows`` (dicts with the same keys; ``None`` where absent) as one Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    keys = list(dict.fromkeys(k for row in rows for k in row))
    table = pa.Table.from_pylist([{k: row.get(k) for k in keys} for row in rows])
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return path
