"""Compares a snapshot exported by memsnap with the torch original; prints OK or the differences.
(roundtrip_equal.py compares every value; this one names every differing key, and with --core
only what a record keeps without the import's extras.)

usage: compare_snapshot.py [--core] ORIGINAL EXPORTED
  default: segments, trace entries, allocator_settings and external_annotations must be equal.
  --core:  only what a record keeps without import extras: trace entries' action, addr, size,
           stream, time_us, frames, device_free, and segments' address, total_size, stream,
           device, segment_type and blocks.
Exit status 0 when equal, 1 otherwise.
"""
import pickle
import sys

TRACE_CORE = ("action", "addr", "size", "stream", "time_us", "frames", "device_free")
SEGMENT_CORE = ("device", "address", "total_size", "stream", "segment_type", "blocks",
                "allocated_size", "active_size", "requested_size")


def load(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def pick(d, keys):
    return {k: d[k] for k in keys if k in d}


def main(argv):
    core = "--core" in argv
    paths = [a for a in argv if a != "--core"]
    orig, exp = load(paths[0]), load(paths[1])
    diffs = []
    if not isinstance(exp, dict):
        print("exported value is not a dict:", type(exp))
        return 1
    os_, es = orig.get("segments", []), exp.get("segments", [])
    if len(os_) != len(es):
        diffs.append(f"segments: {len(os_)} vs {len(es)}")
    for i, (a, b) in enumerate(zip(os_, es)):
        if core:
            a, b = pick(a, SEGMENT_CORE), pick(b, SEGMENT_CORE)
        if a != b:
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            diffs.append(f"segments[{i}] differ in {keys}")
    ot, et = orig.get("device_traces", []), exp.get("device_traces", [])
    if len(ot) != len(et):
        diffs.append(f"device_traces: {len(ot)} vs {len(et)} devices")
    for d, (ta, tb) in enumerate(zip(ot, et)):
        if len(ta) != len(tb):
            diffs.append(f"device_traces[{d}]: {len(ta)} vs {len(tb)} entries")
        for i, (a, b) in enumerate(zip(ta, tb)):
            if core:
                a, b = pick(a, TRACE_CORE), pick(b, TRACE_CORE)
            if a != b:
                keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
                diffs.append(f"device_traces[{d}][{i}] differ in {keys}")
    if not core:
        for key in ("allocator_settings", "external_annotations"):
            if orig.get(key) != exp.get(key):
                diffs.append(f"{key} differs")
    if diffs:
        for line in diffs[:20]:
            print(line)
        if len(diffs) > 20:
            print(f"... {len(diffs) - 20} more")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
