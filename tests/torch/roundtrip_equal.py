"""Checks that a snapshot exported by memsnap holds the same values as the torch original.

usage: roundtrip_equal.py ORIGINAL EXPORTED
Both files are read with pickle.load and compared as values: dict key order may differ, nothing
else may (types included: a tuple is not a list, True is not 1). Prints OK, or the path of the
first difference ("device_traces[0][17]['user_metadata']: 'a' != ''"). Exit status 0 when equal.
"""
import math
import pickle
import sys


def first_difference(a, b, path="snapshot"):
    """The first place where a and b differ, as a line; None when they are equal."""
    if type(a) is not type(b):
        return f"{path}: {type(a).__name__} {a!r:.200} != {type(b).__name__} {b!r:.200}"
    if isinstance(a, dict):
        missing = [k for k in a if k not in b]
        if missing:
            return f"{path}: key {missing[0]!r} is missing from the export"
        extra = [k for k in b if k not in a]
        if extra:
            return f"{path}: key {extra[0]!r} is only in the export"
        for k in a:
            d = first_difference(a[k], b[k], f"{path}[{k!r}]")
            if d:
                return d
        return None
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return None
    if a != b:
        return f"{path}: {a!r:.200} != {b!r:.200}"
    return None


def main(argv):
    if len(argv) != 2:
        print(__doc__)
        return 2
    with open(argv[0], "rb") as f:
        original = pickle.load(f)
    with open(argv[1], "rb") as f:
        exported = pickle.load(f)
    d = first_difference(original, exported)
    if d:
        print(d)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
