"""What a SIGKILLed driver leaves running: its local Ray started by plain ``ray.init`` vs by ``ray_session``.

Each try starts a driver process that brings up a local Ray (``--mode plain``: ``ray.init(include_dashboard=False)``
as the trainer did before; ``--mode session``: ``search_rl.ray_session.ray_session``), starts one actor, lists every
process below it, and kills itself with SIGKILL. ``--wait-s`` seconds later the script lists which of those
processes still run, then kills them (by PID, checking their start time) so the machine is left clean.

    python bench/ray_orphans.py --mode plain --tries 4
    python bench/ray_orphans.py --mode session --tries 4

Last line: ``ray_orphans mode=<m> tries=<n> tries_with_survivors=<k> survivors=<names>``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]

DRIVER = textwrap.dedent(
    """
    import json, os, signal, sys, time
    import psutil, ray
    from contextlib import nullcontext
    from search_rl.ray_session import RUNTIME_ENV, ray_session

    @ray.remote(num_cpus=0.1)
    class Echo:
        def pid(self):
            return os.getpid()

    if sys.argv[1] == "plain":
        ray.init(include_dashboard=False, runtime_env=RUNTIME_ENV)
        session = nullcontext()
    else:
        session = ray_session(None)
    with session:
        ray.get(Echo.remote().pid.remote())
        time.sleep(1.0)
        procs = psutil.Process().children(recursive=True)
        print(json.dumps([[p.pid, p.create_time(), p.name()] for p in procs]), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """
)


def _still_running(procs: list[list], kill: bool) -> list[str]:
    names = []
    for pid, created, name in procs:
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - created) < 0.01 and p.status() != psutil.STATUS_ZOMBIE:
                names.append(name)
                if kill:
                    p.kill()
        except psutil.Error:
            continue
    return names


def one_try(mode: str, wait_s: float) -> list[str]:
    """Names of the driver's descendants still running ``wait_s`` after its SIGKILL."""
    proc = subprocess.run([sys.executable, "-c", DRIVER, mode], cwd=REPO, capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    if not lines:
        raise RuntimeError(f"the driver printed no process list: {proc.stderr[-2000:]}")
    procs = json.loads(lines[-1])
    time.sleep(wait_s)
    survivors = _still_running(procs, kill=False)
    _still_running(procs, kill=True)
    return survivors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["plain", "session"], default="session")
    parser.add_argument("--tries", type=int, default=4)
    parser.add_argument("--wait-s", type=float, default=15.0)
    args = parser.parse_args()
    counts: Counter[str] = Counter()
    with_survivors = 0
    for i in range(args.tries):
        survivors = one_try(args.mode, args.wait_s)
        print(f"try {i + 1}: {len(survivors)} still running after {args.wait_s:g} s: {sorted(survivors)}", flush=True)
        counts.update(set(survivors))
        with_survivors += bool(survivors)
    names = ",".join(f"{n}:{c}" for n, c in sorted(counts.items())) or "none"
    print(f"ray_orphans mode={args.mode} tries={args.tries} tries_with_survivors={with_survivors} survivors={names}")


if __name__ == "__main__":
    main()
