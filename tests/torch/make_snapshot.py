"""Writes hand-made torch memory snapshots with what the torch 2.11 fixtures never show.

usage: make_snapshot.py KIND OUT.pickle
  rich  two devices; a nonzero segment_pool_id, an expandable segment, segment and block frames,
        compile_context and user_metadata, actions memsnap does not know (first, in the middle,
        last, with and without frames, on a device of their own), keys memsnap does not know in a
        segment, a block, an entry and at the top level, and values JSON has no type for: a
        tuple, bytes, a str that is not UTF-8, NaN and infinity, an int beyond 64 bits, a dict with
        int keys, a negative address
  old   what torch before 2.2 wrote: no compile_context or user_metadata in any entry, segments
        without segment_pool_id and is_expandable, no allocator_settings
The layout (keys, types, shared frame lists) follows torch.cuda.memory._dump_snapshot.
"""
import pickle
import sys

MiB = 1 << 20


def frame(name, filename, line):
    return {"name": name, "filename": filename, "line": line}


def rich():
    train = [frame("forward", "model.py", 40), frame("train_step", "train.py", 12), frame("<module>", "train.py", 3)]
    opt = [frame("step", "torch/optim/adamw.py", 210), frame("train_step", "train.py", 20)]
    seg_frames = [frame("_cuda_malloc", "CUDACachingAllocator.cpp", 0), frame("<module>", "train.py", 3)]
    base, pool = 0x7F0000000000, 0x7F1000000000

    def entry(action, addr, size, t, frames=None, **more):
        e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t,
             "compile_context": "N/A", "user_metadata": ""}
        if frames is not None:
            e["frames"] = frames
        e.update(more)
        return e

    trace0 = [
        {"action": "future_begin", "time_us": 999, "note": "first"},  # unknown, no frames
        entry("segment_alloc", base, 20 * MiB, 1000, train),
        entry("alloc", base, 4 * MiB, 1001, train, compile_context="[0/0] torch/_dynamo", user_metadata="layer 1"),
        entry("alloc", base + 4 * MiB, 2 * MiB, 1002, train, user_metadata="layer 2"),
        {"action": "future_mark", "addr": base, "size": 0, "stream": 0, "time_us": 1003, "frames": opt,
         "payload": (1, "two", None)},  # unknown, with frames: interned
        entry("free_requested", base + 4 * MiB, 2 * MiB, 1004, train),
        entry("free_completed", base + 4 * MiB, 2 * MiB, 1005, train, stream_priority=-1),  # an extra key
        entry("segment_map", pool, 2 * MiB, 1006, opt),
        entry("alloc", pool, 1 * MiB, 1007, opt, compile_context=b"\xff\xfe".decode("latin-1")),
        entry("alloc", pool + MiB, 512, 1008),  # no frames
        entry("snapshot", 0, 0, 1009),
        {"action": "future_end", "time_us": 1010, "frames": None, "weird": {1: "int key", "nan": float("nan")}},
    ]
    trace1 = [
        entry("segment_alloc", base + 64 * MiB, 2 * MiB, 1500, train),
        entry("alloc", base + 64 * MiB, 2 * MiB, 1501, train, compile_context="graph 7"),
        entry("oom", 0, 1 << 50, 1502, opt, device_free=3 * MiB),
    ]
    # An oom entry has device_free and no addr.
    del trace1[2]["addr"]
    trace2 = [{"action": "future_only", "time_us": 2000, "device": 2}]
    segments = [
        {"device": 0, "address": base, "total_size": 20 * MiB, "allocated_size": 4 * MiB, "active_size": 4 * MiB,
         "requested_size": 4 * MiB, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
         "is_expandable": False, "frames": seg_frames,
         "blocks": [{"address": base, "size": 4 * MiB, "requested_size": 4 * MiB, "state": "active_allocated", "frames": train},
                    {"address": base + 4 * MiB, "size": 16 * MiB, "requested_size": 2 * MiB, "state": "inactive",
                     "frames": [], "history_id": 7}]},  # a key memsnap does not know, in a block
        {"device": 0, "address": pool, "total_size": 2 * MiB, "allocated_size": 1 * MiB + 512, "active_size": 1 * MiB + 512,
         "requested_size": 1 * MiB + 512, "stream": 7, "segment_type": "small", "segment_pool_id": (1, 3),
         "is_expandable": True, "frames": seg_frames, "graph": "captured",  # a key memsnap does not know
         "blocks": [{"address": pool, "size": 1 * MiB, "requested_size": 1 * MiB, "state": "active_allocated", "frames": opt},
                    {"address": pool + MiB, "size": 512, "requested_size": 512, "state": "active_pending_free"},
                    {"address": pool + MiB + 512, "size": MiB - 512, "requested_size": 0, "state": "inactive"}]},
        {"device": 1, "address": base + 64 * MiB, "total_size": 2 * MiB, "allocated_size": 2 * MiB,
         "active_size": 2 * MiB, "requested_size": 2 * MiB, "stream": -5, "segment_type": "large",  # negative stream
         "segment_pool_id": (0, 0), "is_expandable": False,
         "blocks": [{"address": base + 64 * MiB, "size": 2 * MiB, "requested_size": 2 * MiB, "state": "active_allocated",
                     "frames": train}]},  # no segment frames key
    ]
    return {
        "segments": segments,
        "device_traces": [trace0, trace1, trace2],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "max_split_size": -1,
                               "garbage_collection_threshold": 0.0, "expandable_segments": True,
                               "roundup_power2_divisions": {"1": 0, "2": 0}},
        "external_annotations": [{"stage": "START", "name": "Optimizer.step#AdamW.step", "device": 0, "time_us": 1003},
                                 {"stage": "END", "name": "Optimizer.step#AdamW.step", "device": 0, "time_us": 1004}],
        "future_top_level": {"version": (2, 11), "blob": b"\x00\x01\xff", "big": 1 << 70, "neg_big": -(1 << 65),
                             "inf": float("inf"), "ninf": float("-inf"), 3: "int key", "__tuple__": "looks like a tag",
                             "odd_str": "\udcff"},
        "another": [1.5, -0.0, True, None, "x"],
    }


def old():
    f = [frame("forward", "model.py", 40), frame("<module>", "train.py", 3)]
    base = 0x7E0000000000

    def entry(action, addr, size, t):
        return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": f}

    return {
        "segments": [{"device": 0, "address": base, "total_size": 2 * MiB, "allocated_size": MiB, "active_size": MiB,
                      "requested_size": MiB, "stream": 0, "segment_type": "large",
                      "blocks": [{"address": base, "size": MiB, "requested_size": MiB, "state": "active_allocated",
                                  "frames": f},
                                 {"address": base + MiB, "size": MiB, "state": "inactive"}]}],  # no requested_size
        "device_traces": [[entry("segment_alloc", base, 2 * MiB, 10), entry("alloc", base, MiB, 11),
                           entry("alloc", base + MiB, 4096, 12), entry("free_requested", base + MiB, 4096, 13),
                           entry("free_completed", base + MiB, 4096, 14)]],
    }


def main(argv):
    if len(argv) != 2 or argv[0] not in ("rich", "old"):
        print(__doc__)
        return 2
    snap = rich() if argv[0] == "rich" else old()
    with open(argv[1], "wb") as out:
        pickle.dump(snap, out, protocol=4)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
