"""Times memsnap import against Python's pickle.load on the same real snapshots (issue #30).

Rounds are interleaved (each round runs every tool on every pickle once), each command in its own
process, pinned with taskset when --cpus is given; wall time and peak RSS come from the child's
rusage. Prints min and median per tool and pickle.

  python3 tests/gpu/bench_big_import.py --memsnap .carry/bin/memsnap [--memsnap-old OLD] \
      --rounds 5 --cpus 2-7 big_all.pickle big_python.pickle
"""
import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def run_measured(cmd):
    """Runs cmd; returns (wall seconds, peak RSS MiB) of that child alone."""
    r, w = os.pipe()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        os.execvp(cmd[0], cmd)
    os.close(w)
    os.close(r)
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"bench_big_import: {' '.join(cmd)} failed with {os.waitstatus_to_exitcode(status)}")
    return wall, usage.ru_maxrss / 1024.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--memsnap", required=True)
    ap.add_argument("--memsnap-old", help="an earlier memsnap, timed in the same rounds")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cpus", help="taskset CPU list, e.g. 2-7")
    ap.add_argument("pickles", nargs="+")
    args = ap.parse_args()
    pin = ["taskset", "-c", args.cpus] if args.cpus else []
    work = tempfile.mkdtemp(prefix="memsnap-bench-import-")
    tools = {"memsnap import": args.memsnap}
    if args.memsnap_old:
        tools["memsnap import (old)"] = args.memsnap_old
    results = {}
    for rnd in range(args.rounds):
        for p in args.pickles:
            for name, binary in tools.items():
                out = os.path.join(work, f"r{rnd}.h5")
                wall, rss = run_measured(pin + [binary, "import", p, "--rank", "0", "--batch", "1", "-o", out, "--overwrite"])
                results.setdefault((p, name), []).append((wall, rss))
                shutil.rmtree(out + ".d", ignore_errors=True)
                if os.path.exists(out):
                    os.remove(out)
            code = f"import pickle; pickle.load(open({p!r}, 'rb'))"
            wall, rss = run_measured(pin + [sys.executable, "-c", code])
            results.setdefault((p, "python pickle.load"), []).append((wall, rss))
    shutil.rmtree(work, ignore_errors=True)
    print(f"{'pickle':<28} {'MB':>7}  {'tool':<22} {'time min/median s':>18} {'peak RSS min/median MiB':>24}")
    for (p, name), rows in results.items():
        walls = [w for w, _ in rows]
        rsss = [r for _, r in rows]
        print(f"{os.path.basename(p):<28} {os.path.getsize(p) / 1e6:>7.1f}  {name:<22} "
              f"{min(walls):>8.2f} / {statistics.median(walls):<8.2f} {min(rsss):>11.0f} / {statistics.median(rsss):<10.0f}")


if __name__ == "__main__":
    main()
