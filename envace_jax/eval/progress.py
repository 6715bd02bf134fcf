"""What an evaluation is doing, on stderr: stage lines with elapsed seconds, and a bar over episodes.

An eval of a real model runs for minutes to hours; without these lines nothing is printed until the
results table. stdout stays for the results (``launch/eval.py`` prints the table there). The bar is
tqdm's: ``TQDM_DISABLE=1`` turns it off.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any, Iterator, Sequence


def say(message: str) -> None:
    from tqdm import tqdm

    # Part of the progress display (with the bar below), not a log record: tqdm.write moves an open bar below
    # the line instead of gluing the line onto the bar's row, which a logging handler writing to stderr does.
    tqdm.write(f"eval: {message}", file=sys.stderr)


@contextlib.contextmanager
def stage(what: str) -> Iterator[None]:
    """A line when ``what`` starts and one when it ends (or fails), with the seconds it took."""
    say(f"{what} ...")
    t0 = time.perf_counter()
    try:
        yield
    except BaseException:
        say(f"{what}: failed after {time.perf_counter() - t0:.1f} s")
        raise
    say(f"{what}: done in {time.perf_counter() - t0:.1f} s")


def count_bar(total: int, desc: str, unit: str):
    """A tqdm bar over ``total`` items on stderr (``update(n)`` as they are done; ``close()`` at the end)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True)


class EpisodeBar:
    """A bar over ``total`` episodes of one engine run, advanced by ``RolloutEngine``'s ``on_step`` hook
    (called after every micro-step with all episodes) as episodes end. ``start`` shows it when that run
    begins, so that what runs before (test-time rehearsal rounds) prints its lines without a bar
    standing at 0 and the bar's rate counts the run only."""

    def __init__(self, total: int, desc: str):
        self.total, self.desc = total, desc
        self._bar = None

    def start(self) -> None:
        if self._bar is None:
            self._bar = count_bar(self.total, self.desc, "episode")

    def on_step(self, step: int, episodes: Sequence[Any]) -> None:
        self.start()
        done = sum(bool(e.done) for e in episodes)
        if done > self._bar.n:
            self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> "EpisodeBar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
