"""Checks a snapshot that memsnap exported against the torch original, with torch itself.

usage: python check_export_roundtrip.py ORIGINAL.pickle EXPORTED.pickle

  ORIGINAL  a pickle from torch.cuda.memory._dump_snapshot (e.g. tests/data/torch-2.11/*.pickle)
  EXPORTED  what `memsnap import ORIGINAL ... && memsnap export STORE ... --format torch` wrote

1. pickle.load gives the same values from both files: dict key order aside, nothing may differ
   (types included: a tuple is not a list). The first difference is named.
2. torch.cuda._memory_viz reads the export as it reads the original: each of its readers that this
   torch has (segments, memory, segsum, trace, compare, trace_plot, segment_plot) is run on both
   and must give the same text. A reader this torch lacks is skipped; one that fails on the
   original too is reported and not counted. Fails when none ran.

Needs only torch (no GPU, no network: the flame graph script is never fetched), the two files and
tests/torch/roundtrip_equal.py beside it in the checkout.
Exit status 0 when every check passed.
"""
import base64
import contextlib
import copy
import inspect
import io
import json
import math
import pickle
import os
import re
import sys

# The value comparison is the one the CPU tests use (tests/torch/roundtrip_equal.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))
from roundtrip_equal import first_difference  # noqa: E402


def lines_only(flamegraph_lines, *args, **kwargs):
    """Stands in for _memory_viz.format_flamegraph, which would download flamegraph.pl."""
    return flamegraph_lines


def takes(fn, name):
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def embedded_snapshot(html):
    """The snapshot a *_plot HTML page embeds (base64 of its pickle), or None if not found."""
    m = re.search(r'"base64":\s*"([A-Za-z0-9+/=]+)"', html)
    if not m:
        return None
    return pickle.loads(base64.b64decode(m.group(1)).rstrip(b"\x00"))


def readers(mv):
    """(name, function of a snapshot returning comparable text) for each reader this torch has."""
    out = []

    def flame(fn_name, pick):
        fn = getattr(mv, fn_name, None)
        if fn is None:
            return
        if takes(fn, "format_flamegraph"):
            out.append((fn_name, lambda snap: fn(pick(snap), format_flamegraph=lines_only)))
        else:
            out.append((fn_name, None))  # would need network for flamegraph.pl: skipped

    flame("segments", lambda s: s)
    flame("memory", lambda s: s)
    compare = getattr(mv, "compare", None)
    if compare is not None and takes(compare, "format_flamegraph"):
        def run_compare(snap):
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                result = compare(snap["segments"], snap["segments"], format_flamegraph=lines_only)
            return printed.getvalue() + str(result)
        out.append(("compare", run_compare))
    for name in ("segsum", "trace"):
        fn = getattr(mv, name, None)
        if fn is not None:
            out.append((name, lambda snap, fn=fn: str(fn(copy.deepcopy(snap)))))
    for name, kwargs in (("trace_plot", {}), ("trace_plot", {"plot_segments": True}),
                         ("trace_plot", {"filter_freed": True}), ("segment_plot", {})):
        fn = getattr(mv, name, None)
        if fn is None or any(not takes(fn, k) for k in kwargs):
            continue

        def run_plot(snap, fn=fn, kwargs=kwargs):
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                html = fn(copy.deepcopy(snap), **kwargs)  # filter_freed edits its argument
            embedded = embedded_snapshot(html)
            if embedded is None:
                raise LookupError("no embedded snapshot found in the page (another torch's layout?)")
            # The page holds the snapshot itself: compare what it holds, not the base64 text
            # (pickle bytes differ between equal values).
            return printed.getvalue() + json.dumps(summary_of(embedded))
        label = name + "(" + ", ".join(f"{k}={v}" for k, v in kwargs.items()) + ")"
        out.append((label, run_plot))
    return out


def summary_of(snap):
    """A canonical text of a snapshot's values (dict key order aside)."""
    def canon(v):
        if isinstance(v, dict):
            return {"dict": sorted(([canon(k), canon(x)] for k, x in v.items()), key=repr)}
        if isinstance(v, (list, tuple)):
            return {type(v).__name__: [canon(x) for x in v]}
        if isinstance(v, float) and math.isnan(v):
            return "nan"
        if isinstance(v, bytes):
            return {"bytes": v.hex()}
        return [type(v).__name__, repr(v)]
    return canon(snap)


def main(argv):
    if len(argv) != 2:
        print(__doc__)
        return 2
    with open(argv[0], "rb") as f:
        original = pickle.load(f)
    with open(argv[1], "rb") as f:
        exported = pickle.load(f)
    failures = []
    d = first_difference(original, exported)
    if d:
        failures.append(f"pickle values differ: {d}")
    else:
        print("ok    pickle.load: the same values")

    import torch
    from torch.cuda import _memory_viz as mv
    print(f"torch {torch.__version__}")
    ran = 0
    for name, fn in readers(mv):
        if fn is None:
            print(f"skip  _memory_viz.{name}: needs flamegraph.pl from the network")
            continue
        try:
            want = fn(original)
        except Exception as e:  # noqa: BLE001 - torch's own reader on torch's own file
            print(f"skip  _memory_viz.{name}: fails on the original too ({type(e).__name__}: {e})")
            continue
        try:
            got = fn(exported)
        except Exception as e:  # noqa: BLE001
            failures.append(f"_memory_viz.{name} fails on the export: {type(e).__name__}: {e}")
            continue
        ran += 1
        if got != want:
            at = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
            failures.append(f"_memory_viz.{name}: the export reads differently (from character {at}: "
                            f"{got[at:at + 80]!r} vs {want[at:at + 80]!r})")
        else:
            print(f"ok    _memory_viz.{name}: reads the export as the original ({len(got)} characters)")
    if ran == 0:
        failures.append("no torch.cuda._memory_viz reader ran on the export")
    for line in failures:
        print(f"FAIL  {line}")
    print("OK" if not failures else f"{len(failures)} check(s) failed")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
