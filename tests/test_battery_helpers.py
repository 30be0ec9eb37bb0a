"""Reliability checks of the helpers under the commands: the folder lock, prior-folder validation,
kernel files, API argument checks, streamed sample statistics, train-prior's folders and the
rank logic of usage errors under torchrun."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from nfc_dps.cli.common import LOCK_FILE, UsageError
from nfc_dps.cli.outputs import folder_lock

# ---------------------------------------------------------------- the folder lock (S4, S5)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _racer(folder: str, rounds: int, start, attempted, released, results) -> None:
    """Each round: wait for the start, try the lock, report, hold it until both have tried."""
    for _ in range(rounds):
        start.wait()
        try:
            with folder_lock(Path(folder)):
                results.put(1)
                attempted.wait()
        except UsageError:
            results.put(0)
            attempted.wait()
        released.wait()


def test_two_runs_racing_for_a_stale_lock_never_both_hold_it(tmp_path: Path) -> None:
    """S5: a lock file left by a dead run, found by two runs at once: exactly one holds the lock,
    every round (the earlier read-pid / unlink / create takeover let both hold it)."""
    rounds = 1000
    ctx = mp.get_context("fork")
    start, attempted, released = (ctx.Barrier(3) for _ in range(3))
    results = ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(str(tmp_path), rounds, start, attempted, released, results))
             for _ in range(2)]
    for p in procs:
        p.start()
    stale = str(_dead_pid())
    winners = []
    try:
        for _ in range(rounds):
            (tmp_path / LOCK_FILE).write_text(stale)
            start.wait(timeout=60)
            got = results.get(timeout=60) + results.get(timeout=60)
            attempted.wait(timeout=60)
            released.wait(timeout=60)
            winners.append(got)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    assert winners == [1] * rounds, f"rounds with {sorted(set(winners))} holders: {winners.count(2)} with two"


_HOLDER = """
import sys, time
from pathlib import Path
from nfc_dps.cli.outputs import folder_lock
with folder_lock(Path(sys.argv[1])):
    print("locked", flush=True)
    time.sleep(60)
"""


def hold_lock(folder: Path) -> subprocess.Popen:
    """A process holding ``folder``'s lock (kill it to let go)."""
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(folder)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "locked"
    return p


def test_a_killed_holder_frees_the_lock_and_a_live_one_is_named(tmp_path: Path) -> None:
    holder = hold_lock(tmp_path)
    try:
        with pytest.raises(UsageError, match=f"another nfc-dps run \\(pid {holder.pid}\\)"):
            with folder_lock(tmp_path):
                pass
    finally:
        holder.kill()
        holder.wait()
    assert (tmp_path / LOCK_FILE).exists()  # left behind by the kill, and free
    with folder_lock(tmp_path):
        assert (tmp_path / LOCK_FILE).read_text() == str(os.getpid())
    assert not (tmp_path / LOCK_FILE).exists()
