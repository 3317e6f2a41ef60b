"""memsnap's startup hook for Python jobs started by ``memsnap run``.

``memsnap run`` puts this folder first on PYTHONPATH, so Python imports this file at startup. It
attaches memsnap to PyTorch's allocator right after the job imports ``torch`` (and never imports
torch itself), then runs the sitecustomize that it hides, if the job has one. Any failure gives
one line and the job runs on.
"""

import importlib.abc
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))


class _AttachAfterTorchImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps torch's own loader so that attach() runs once torch is loaded."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_torch = spec.loader.exec_module

        def exec_module(module):
            run_torch(module)
            try:
                import memsnap_torch

                memsnap_torch.attach()
            except Exception as e:  # noqa: BLE001 - do no harm
                sys.stderr.write("memsnap warning: cannot attach to PyTorch (%s); the job goes on\n" % e)

        spec.loader.exec_module = exec_module
        return spec


def _run_hidden_sitecustomize():
    for entry in sys.path:
        folder = os.path.abspath(entry or os.getcwd())
        if folder == _here:
            continue
        candidate = os.path.join(folder, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_memsnap_hidden_sitecustomize", candidate)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return


if os.environ.get("MEMSNAP_TORCH_ATTACHMENT", "true").lower() not in ("0", "false", "no", "off") and \
        os.environ.get("MEMSNAP_ENABLED", "true").lower() not in ("0", "false", "no", "off"):
    if "torch" in sys.modules:
        try:
            import memsnap_torch

            memsnap_torch.attach()
        except Exception:  # noqa: BLE001
            pass
    else:
        sys.meta_path.insert(0, _AttachAfterTorchImport())
_run_hidden_sitecustomize()
