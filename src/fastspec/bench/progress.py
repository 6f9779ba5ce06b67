"""The bench's and the sweep's progress display: a live bar on a terminal, plain lines where
stderr goes to a file or a pipe.

rich's live bar draws nothing on a stream that is not a terminal (and, transient, leaves
nothing behind), so a run logged with ``2> log`` or under ``nohup`` said nothing for the
twenty minutes to an hour it takes on a slow or busy machine, as if stuck.  There each new
step gets one line instead: elapsed time, steps done of the total, and what runs now."""
from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class LineProgress:
    """What the bench and the sweep use of rich's ``Progress`` (``add_task``, ``update``,
    ``advance``; a context manager), written as one line per change of description."""

    def __init__(self, prefix: str, stream: TextIO | None = None, disable: bool = False) -> None:
        self.prefix = prefix
        self.stream = stream
        self.disable = disable
        self.tasks: dict[int, dict[str, Any]] = {}
        self.start = time.monotonic()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, description: str, total: float | None = None) -> int:
        task = len(self.tasks)
        self.tasks[task] = {"description": description, "total": total, "completed": 0.0}
        self._say(task)
        return task

    def update(self, task: int, description: str | None = None, total: float | None = None) -> None:
        t = self.tasks[task]
        if total is not None:
            t["total"] = total
        if description is not None and description != t["description"]:
            t["description"] = description
            self._say(task)

    def advance(self, task: int, advance: float = 1.0) -> None:
        self.tasks[task]["completed"] += advance

    def _say(self, task: int) -> None:
        if self.disable:
            return
        t = self.tasks[task]
        s = int(time.monotonic() - self.start)
        done = f"{t['completed']:.0f}/{t['total']:.0f}" if t["total"] else f"{t['completed']:.0f}"
        stream = self.stream if self.stream is not None else sys.stderr
        print(f"{self.prefix}: {s // 3600}:{s // 60 % 60:02d}:{s % 60:02d} {done} {t['description']}",
              file=stream, flush=True)


def progress(prefix: str, width: int, quiet: bool) -> Progress | LineProgress:
    """A live bar (description padded to ``width``) where stderr is a terminal, else a
    ``LineProgress`` whose lines start with ``prefix``; nothing shown with ``quiet``."""
    console = Console(stderr=True)
    if console.is_terminal and not quiet:
        return Progress(TextColumn(f"{{task.description:<{width}}}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, transient=True)
    return LineProgress(prefix, disable=quiet)
