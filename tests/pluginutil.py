"""A package of another project, as pip would leave it installed: its module, and a dist-info whose
entry_points.txt registers one of its objects in one of our entry-point groups."""
from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def installed_plugin(site: Path, package: str, source: str, group: str, entry: str) -> dict[str, str]:
    """`package` (its __init__ is `source`) under `site`, declaring `entry` ("name = module:attr") in
    `group`; returns an environment whose Python finds it (and this checkout)."""
    (site / package).mkdir(parents=True)
    (site / package / "__init__.py").write_text(source, encoding="utf-8")
    info = site / f"{package}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package.replace('_', '-')}\nVersion: 0.1\n",
                                   encoding="utf-8")
    (info / "entry_points.txt").write_text(f"[{group}]\n{entry}\n", encoding="utf-8")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]), NO_PROXY="127.0.0.1,localhost")
