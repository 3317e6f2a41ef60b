"""The PyTorch attachment's Python side, without torch or a GPU: memsnap run's startup hook
(lib/torch/python/sitecustomize.py) and the memsnap_torch module, against a stand-in `torch`
package that records what memsnap asks of it. The attachment library itself needs a real torch:
tests/gpu/torch_attachment.sh runs it on a GPU.

  python3 test_torch_hook.py MEMSNAP_BINARY PYTHON_HOOK_FOLDER
"""
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

MEMSNAP, HOOK = sys.argv[1], sys.argv[2]

FAKE_TORCH = {
    "torch/__init__.py": """
        from . import cuda, optim
        IMPORTED = True
    """,
    "torch/cuda.py": """
        LAZY_CALLS = []
        def _lazy_call(fn, **kwargs):
            LAZY_CALLS.append(fn)
    """,
    "torch/optim/__init__.py": "",
    "torch/optim/optimizer.py": """
        STEP_HOOKS = []
        def register_optimizer_step_post_hook(hook):
            STEP_HOOKS.append(hook)
    """,
}


class TorchHook(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.fake = os.path.join(self.tmp.name, "site")
        for name, text in FAKE_TORCH.items():
            path = os.path.join(self.fake, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(textwrap.dedent(text))

    def tearDown(self):
        self.tmp.cleanup()

    def python(self, code, **env):
        e = {k: v for k, v in os.environ.items() if not k.startswith("MEMSNAP_") and k != "PYTHONPATH"}
        e["PYTHONPATH"] = HOOK + ":" + self.fake
        e["MEMSNAP_TORCH_LIBRARY"] = os.path.join(self.tmp.name, "no-such-libmemsnap_pytorch.so")
        e.update(env)
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True, text=True,
                              timeout=60)

    def test_attaches_right_after_the_job_imports_torch(self):
        real = os.path.join(self.tmp.name, "real.so")
        open(real, "w").close()  # not a library: loading fails with one line, the job goes on
        r = self.python("""
            import sys
            assert "memsnap_torch" not in sys.modules, "nothing happens before torch is imported"
            import torch
            print("job ran; memsnap_torch loaded:", "memsnap_torch" in sys.modules)
        """, MEMSNAP_TORCH_LIBRARY=real)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("job ran; memsnap_torch loaded: True", r.stdout)
        lines = [l for l in r.stderr.splitlines() if l.startswith("memsnap")]
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn("cannot load the PyTorch attachment", lines[0])
        self.assertIn("the job goes on", lines[0])

    def test_a_missing_library_is_one_line_and_the_job_runs_on(self):
        r = self.python("""
            import torch, memsnap_torch
            print("attach again:", memsnap_torch.attach(), "recording:", memsnap_torch.recording())
            memsnap_torch.step(); print("dump:", memsnap_torch.dump())
        """)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("attach again: False recording: False", r.stdout)
        self.assertIn("dump: False", r.stdout)
        self.assertEqual(r.stderr.count("is not there"), 1, r.stderr)

    def test_no_torch_import_means_nothing_loaded(self):
        r = self.python("import sys, json; print('memsnap_torch' in sys.modules)")
        self.assertEqual((r.returncode, r.stdout.strip(), r.stderr), (0, "False", ""))

    def test_disabled_by_config_variables(self):
        for env in ({"MEMSNAP_ENABLED": "false"}, {"MEMSNAP_TORCH_ATTACHMENT": "false"}):
            r = self.python("import sys, torch; print('memsnap_torch' in sys.modules)", **env)
            self.assertEqual((r.returncode, r.stdout.strip(), r.stderr), (0, "False", ""), env)

    def test_the_jobs_own_sitecustomize_still_runs(self):
        mine = os.path.join(self.tmp.name, "mine")
        os.makedirs(mine)
        with open(os.path.join(mine, "sitecustomize.py"), "w") as f:
            f.write("import builtins\nbuiltins.MINE_RAN = True\n")
        r = self.python("import builtins; print(getattr(builtins, 'MINE_RAN', False))",
                        PYTHONPATH=HOOK + ":" + mine + ":" + self.fake)
        self.assertEqual(r.stdout.strip(), "True", r.stderr)

    def test_with_the_library_torch_is_asked_for_the_lazy_call_and_the_step_hook(self):
        # The attach path up to the library: a stand-in for ctypes.CDLL records the calls.
        r = self.python("""
            import ctypes, os
            calls = []
            class Fn:
                def __init__(self, name): self.name = name
                def __call__(self, *a): calls.append(self.name); return 1
            class Lib:
                def __getattr__(self, name):
                    fn = Fn(name); setattr(self, name, fn); return fn
            ctypes.CDLL = ctypes.PyDLL = lambda path: Lib()
            open(os.environ["MEMSNAP_TORCH_LIBRARY"], "w").close()
            import torch, torch.optim.optimizer as o
            import memsnap_torch
            print("lazy calls:", len(torch.cuda.LAZY_CALLS), "step hooks:", len(o.STEP_HOOKS))
            class Opt: pass
            a, b = Opt(), Opt()
            for _ in range(3):  # a GAN's two optimizers: one batch each round
                o.STEP_HOOKS[0](a, (), {}); o.STEP_HOOKS[0](b, (), {})
            print("hints:", calls.count("memsnap_torch_step_hint"))
            del a; import gc; gc.collect()
            o.STEP_HOOKS[0](b, (), {})  # the first one is gone: the next one counts
            print("hints after:", calls.count("memsnap_torch_step_hint"))
        """)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("lazy calls: 1 step hooks: 1", r.stdout)
        self.assertIn("hints: 3", r.stdout)
        self.assertIn("hints after: 4", r.stdout)


class RunSetsTheHook(unittest.TestCase):
    def run_memsnap(self, *args, config=None):
        with tempfile.TemporaryDirectory() as tmp:
            e = {k: v for k, v in os.environ.items() if not k.startswith("MEMSNAP_")}
            e.update({"PYTHONPATH": "/already/there", "MEMSNAP_FOLDER": os.path.join(tmp, "run")})
            cmd = [MEMSNAP, "run", "--no-aggregate", "--no-cupti"]
            if config:
                path = os.path.join(tmp, "memsnap.yaml")
                with open(path, "w") as f:
                    f.write(config)
                cmd += ["--config", path]
            cmd += list(args) + ["--", sys.executable, "-c", "import os; print('PP=' + os.environ.get('PYTHONPATH', ''))"]
            r = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            return [l[3:] for l in r.stdout.splitlines() if l.startswith("PP=")][0]

    def test_python_jobs_get_the_hook_first_and_keep_their_path(self):
        self.assertEqual(self.run_memsnap(), os.path.realpath(HOOK) + ":/already/there")

    def test_no_torch_and_the_config_key_turn_it_off(self):
        self.assertEqual(self.run_memsnap("--no-torch"), "/already/there")
        self.assertEqual(self.run_memsnap(config="torch_attachment: false\n"), "/already/there")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
