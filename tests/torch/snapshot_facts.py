"""Prints, as one JSON line, what Python's pickle module sees in a torch memory snapshot.

test_torch compares memsnap's import against these numbers, so the expectations come from the
reference reader at test time rather than being hard-coded.
"""
import collections
import json
import pickle
import sys


def main(path):
    with open(path, "rb") as f:
        snap = pickle.load(f)
    traces = snap.get("device_traces") or []
    segments = snap.get("segments") or []
    frames, stacks, list_ids = set(), set(), set()
    list_refs = 0

    def note(frame_list):
        nonlocal list_refs
        list_refs += 1
        list_ids.add(id(frame_list))
        key = tuple((f["name"], f["filename"], f["line"]) for f in frame_list)
        stacks.add(key)
        frames.update(key)

    for trace in traces:
        for entry in trace:
            if "frames" in entry:
                note(entry["frames"])
    blocks = active_blocks = active_requested = reserved = 0
    for seg in segments:
        reserved += seg["total_size"]
        if "frames" in seg:
            note(seg["frames"])
        for block in seg["blocks"]:
            blocks += 1
            if block["state"] != "inactive":
                active_blocks += 1
                active_requested += block["requested_size"]
            if "frames" in block:
                note(block["frames"])
    actions = collections.Counter(e["action"] for t in traces for e in t)
    print(json.dumps({
        "trace_entries": [len(t) for t in traces],
        "segments": len(segments),
        "blocks": blocks,
        "active_blocks": active_blocks,
        "active_requested_bytes": active_requested,
        "reserved_bytes": reserved,
        "actions": actions,
        "unique_frames": len(frames),
        "unique_stacks": len(stacks),
        "frame_list_refs": list_refs,
        "frame_list_objects": len(list_ids),
    }))


if __name__ == "__main__":
    main(sys.argv[1])
