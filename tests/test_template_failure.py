"""A runtime that cannot be imported stops the campaign with one line, not a traceback of ours.

The defect module makes `hermes.finalizer` unimportable in worker processes (the warm template
included), as a broken runtime or a planted mutant would be: the template dies at its imports.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BROKEN = '''
import os, sys
sys.path.insert(0, os.path.join({repo!r}, "tests", "defects"))
from worker_only import is_worker
if is_worker():
    sys.modules["hermes.finalizer"] = None  # importing it raises ImportError
'''


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_template_that_cannot_import_the_runtime_ends_the_campaign_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(BROKEN.format(repo=str(REPO)))
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}")
    done = subprocess.run([sys.executable, "-m", "supervisor", "chaos", "--case", "single-tool/fault-free"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                          start_new_session=True, check=False)
    assert done.returncode == 1, done.stderr[-3000:]
    ours = done.stderr.split("ModuleNotFoundError", 1)[-1]  # after the template's own import error
    assert "hermes-supervisor: error: the worker template exited" in ours
    assert "Traceback" not in ours, done.stderr[-3000:]
