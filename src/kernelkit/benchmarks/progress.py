"""Progress: `Progress`, the one-line bar of `kernelkit bench` and the bench/ scripts, and `Tick`,
what each suite calls as a step begins."""

from __future__ import annotations

import shutil
import sys
import time
from typing import Callable

Tick = Callable[[str], None]


def _no_tick(label: str) -> None:
    pass


class Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal."""

    def __init__(self, total: int, stream=None, enabled: bool | None = None):
        self.stream = stream or sys.stderr
        self.total, self.done = max(total, 1), 0
        try:
            tty = self.stream.isatty()
        except (AttributeError, ValueError):
            tty = False
        self.enabled = tty if enabled is None else enabled
        self.start = time.perf_counter()

    def tick(self, label: str) -> None:
        """A step begins: draw the bar with the steps done so far and the step's label."""
        self._draw(label)
        self.done = min(self.done + 1, self.total - 1)

    def _draw(self, label: str) -> None:
        if not self.enabled:
            return
        width = max(shutil.get_terminal_size((80, 24)).columns - 1, 20)
        bar = 24
        filled = bar * self.done // self.total
        text = (f"[{'#' * filled}{'.' * (bar - filled)}] {self.done}/{self.total} "
                f"{time.perf_counter() - self.start:4.0f}s  {label}")
        self.stream.write("\r" + text[:width].ljust(width))
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            width = max(shutil.get_terminal_size((80, 24)).columns - 1, 20)
            self.stream.write("\r" + " " * width + "\r")
            self.stream.flush()
