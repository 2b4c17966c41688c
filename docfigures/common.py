"""What every figure's measuring and rendering shares: where the stores live, how a store is
read and written, and how a measuring child runs (its own session, killed whole on timeout)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FIGURES = REPO / "docs" / "figures"


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def write_json(path: Path, data: dict[str, Any], sort_keys: bool = True) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=sort_keys, ensure_ascii=False) + "\n", encoding="utf-8")


def today() -> str:
    return time.strftime("%Y-%m-%d", time.gmtime())


def load_1m() -> float:
    return round(os.getloadavg()[0], 2)


def child_env() -> dict[str, str]:
    """The loopback model server must not go through a proxy; `hermes` imports from this checkout."""
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run a child in its own session; on timeout kill its process group by the recorded pid."""
    proc = subprocess.Popen(argv, cwd=REPO, env=child_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return subprocess.CompletedProcess(argv, -signal.SIGKILL, out, err + f"\ntimed out after {timeout:.0f}s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def campaign_report(argv: list[str], report_dir: Path, timeout: float, python: str = sys.executable) -> dict[str, Any]:
    """Run `hermes-supervisor ARGV --report REPORT_DIR` and read its report.json (RuntimeError if it wrote none)."""
    done = run([python, "-m", "supervisor", *argv, "--report", str(report_dir)], timeout)
    path = report_dir / "report.json"
    if not path.exists():
        raise RuntimeError(f"{' '.join(argv)} wrote no report (exit {done.returncode})\n{done.stdout[-3000:]}\n"
                           f"{done.stderr[-3000:]}")
    return read_json(path)
