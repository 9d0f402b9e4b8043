"""Did the trace cache on disk earn its risk? ``introspect trace`` on MiniLM, whole process.

Runs the command as a fresh process again and again, alternating the cache on (after a
warm-up run that fills it) and ``INTROSPECT_NO_CACHE=1``, and prints the median wall and
CPU time of each, and the gain as a share of the whole process. Alternating keeps a slow
spell of a shared machine from landing on one side only.

This decided the disk layer's fate: run on a tree that still had it (commit 9c2315f), a
warm disk cache saved 2.5 to 4% of the whole process (README, "a graph cache"), under the
5% it had to earn, so it was removed. On today's tree both sides trace for real (a fresh
process has nothing in memory); the script stays to measure any disk layer proposed again.

    python -m benchmarks.cache_bench [--runs 7] [--model minilm]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def run_once(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system, children) of one run of ``command``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cache_bench",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs of each side (default: 7)")
    parser.add_argument("--model", default="minilm", help="the model traced (default: minilm)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="introspect-cache-bench-") as folder:
        output = os.path.join(folder, "nodes.csv")
        command = [sys.executable, "-m", "introspect", "trace", "--model", args.model,
                   "--format", "csv", "-o", output]
        base = {**os.environ, "HF_HUB_OFFLINE": "1", "INTROSPECT_CACHE_DIR": folder}
        base.pop("INTROSPECT_NO_CACHE", None)
        sides = {"cache on": base, "INTROSPECT_NO_CACHE=1":
                 {**base, "INTROSPECT_NO_CACHE": "1"}}
        run_once(command, base)  # writes the entry, and warms the file system's cache
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
        for _ in range(args.runs):
            for name, env in sides.items():
                times[name].append(run_once(command, env))
        entries = os.listdir(os.path.join(folder, "graphs")) \
            if os.path.isdir(os.path.join(folder, "graphs")) else []
    print(f"`introspect trace --model {args.model}`, whole process, {args.runs} runs each "
          f"(alternating), disk entries: {len(entries)}")
    medians = {}
    for name, rows in times.items():
        wall = statistics.median(w for w, _ in rows)
        cpu = statistics.median(c for _, c in rows)
        medians[name] = (wall, cpu)
        print(f"  {name:24s} wall {wall:.3f} s  CPU {cpu:.3f} s  "
              f"(walls: {', '.join(f'{w:.2f}' for w, _ in rows)})")
    (warm_wall, warm_cpu), (cold_wall, cold_cpu) = medians.values()
    print(f"  gain of the cache: wall {cold_wall - warm_wall:+.3f} s "
          f"({(cold_wall - warm_wall) / cold_wall:+.1%}), CPU {cold_cpu - warm_cpu:+.3f} s "
          f"({(cold_cpu - warm_cpu) / cold_cpu:+.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
