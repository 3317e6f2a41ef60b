"""Checks what memsnap's CUPTI capture recorded of tests/cupti/alloc_pattern against what the
program says it did (its `expect` lines): the same events, exactly, window by window.

  python3 check_pattern.py PATTERN_STDOUT SPILL_DUMP_JSONL [--stacks]
Prints a JSON summary; exits 1 on any difference.
"""
import collections
import json
import sys


def main():
    stdout_path, dump_path = sys.argv[1], sys.argv[2]
    want_stacks = "--stacks" in sys.argv
    expected = collections.defaultdict(collections.Counter)
    for line in open(stdout_path):
        if line.startswith("expect "):
            _, window, action, device, addr, size, stream = line.split()
            expected[int(window)][(action, int(device), int(addr), int(size), int(stream))] += 1
    meta, windows, events = None, [], collections.defaultdict(list)
    for line in open(dump_path):
        rec = json.loads(line)
        if rec["kind"] == "meta":
            meta = rec
        elif rec["kind"] == "window":
            windows.append(rec)
        else:
            events[rec["window"]].append(rec)
    problems = []
    summary = {"meta": meta, "windows": []}
    for w in windows:
        b = w["batch_end"]
        # An oom event's addr holds the device's free bytes (checked below), not an address.
        got = collections.Counter((e["action"], e["device"], 0 if e["action"] == "oom" else e["addr"], e["size"],
                                   e["stream"]) for e in events[b])
        want = expected.get(b, collections.Counter())
        missing, extra = want - got, got - want
        row = {
            "window": b, "batch_start": w["batch_start"], "oom": w["oom"], "events": w["events"],
            "expected": sum(want.values()), "missing": [list(k) for k in missing], "extra": [list(k) for k in extra],
            "alloc_bytes": sum(e["size"] for e in events[b] if e["action"] == "alloc"),
            "expected_alloc_bytes": sum(k[3] * n for k, n in want.items() if k[0] == "alloc"),
            "by_action": dict(collections.Counter(e["action"] for e in events[b])),
        }
        summary["windows"].append(row)
        if missing or extra:
            problems.append(f"window {b}: {len(missing)} events missing, {len(extra)} unexpected")
    if sorted(expected) != sorted(w["batch_end"] for w in windows):
        problems.append(f"windows {sorted(w['batch_end'] for w in windows)}, expected {sorted(expected)}")
    oom = [w for w in windows if w["oom"]]
    if len(oom) != 1 or oom[0]["batch_end"] != 7:
        problems.append("expected exactly one OOM window, named 7")
    oom_events = [e for e in events.get(7, []) if e["action"] == "oom"]
    summary["oom_device_free"] = oom_events[0]["addr"] if oom_events else None
    if oom_events and oom_events[0]["addr"] == 0:
        problems.append("the OOM event has no free bytes (cuMemGetInfo in the exit callback)")
    if meta is None or meta["source"] != "cupti" or not meta["ended"]:
        problems.append(f"meta: {meta}")
    if want_stacks:
        firsts = [e for e in events.get(3, []) if e["action"] == "alloc" and e["device"] == meta["rank"] and e["frames"]]
        site = [e["frames"] for e in firsts if any("allocate_batch_buffer" in f for f in e["frames"])]
        summary["stack_example"] = (site or [e["frames"] for e in firsts] or [[]])[0][:8]
        summary["allocs_with_caller_frame"] = len(site)
        if len(site) != 6:  # A and B in each of batches 1-3
            problems.append(f"{len(site)} of 6 cudaMalloc stacks name allocate_batch_buffer")
    summary["problems"] = problems
    print(json.dumps(summary, indent=1))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
