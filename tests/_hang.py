"""A call that must return: run in a worker thread, and a hang fails the test instead of stalling the suite."""

from __future__ import annotations

import concurrent.futures
from typing import Callable

import pytest


def run_with_timeout(fn: Callable[[], object], seconds: float) -> object:
    """Run ``fn`` in a worker thread; fail (instead of hanging) when it has not returned in ``seconds``."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(fn).result(timeout=seconds)
    except concurrent.futures.TimeoutError:
        pytest.fail(f"did not return within {seconds} s (a hang)")
    finally:
        pool.shutdown(wait=False)
