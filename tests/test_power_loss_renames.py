"""A file the daemon replaces by a rename keeps its new name through a power cut only because the
directory is fsynced after the rename.

The daemon writes its API token with `hermes.private_files.replace_file_durably` (a temp file,
fsynced, renamed over the name, then the directory fsynced), and hands it out once it is ready:
clients keep it. Each test starts the real daemon on a lazy file system (the rig of
tests/test_daemon_power_loss.py), takes the token a client would keep, cuts the power under it
(everything it started SIGKILLed by recorded pid, the lazy file system crashed with `drop`), and
looks at what the next boot finds, then starts the daemon again on a fresh mount. Renames are lazy
there until their directory is fsynced, as on a mount without ``dirsync``.

With the planted defect `tests/defects/rename_not_dir_synced` (no directory fsync after the
rename) the token's name is lost with the cut: the next daemon makes a new token and every client
that kept the old one is locked out. With plain SIGKILLs and no cut the same defect loses nothing
(the kernel kept the rename), and the real runtime keeps its token through the cut.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from test_daemon_power_loss import PowerRig, rigs  # noqa: F401  (the fixture, used by name)

pytestmark = [pytest.mark.chaos, pytest.mark.xdist_group("chaos")]

DEFECT = Path(__file__).resolve().parent / "defects" / "rename_not_dir_synced"
MARKER = "defect armed: rename-not-dir-synced"


@pytest.mark.parametrize(("defect", "power_cut"), [(False, True), (True, True), (True, False)],
                         ids=["intact-power-cut", "defect-power-cut", "defect-kill-9-only"])
def test_the_api_token_a_client_kept_survives_a_power_cut(
        rigs: list[PowerRig], tmp_path: Path, defect: bool, power_cut: bool) -> None:  # noqa: F811
    rig = PowerRig(tmp_path, defect=DEFECT if defect else None)
    rigs.append(rig)
    rig.start()  # ready: the token file is written and a client has read it
    kept = rig.token
    assert kept

    rig.cut("drop" if power_cut else None, seed=0)
    token_file = rig.backing / "state" / "state.db.token"  # as the next boot finds it
    on_disk = token_file.read_text(encoding="ascii").strip() if token_file.exists() else None
    rig.remount()

    assert (MARKER in rig.logs()) == defect, "the defect is armed in the daemon exactly when planted"
    if defect and power_cut:
        assert on_disk is None, "the defect's rename of the token file should not survive the cut"
        with pytest.raises(AssertionError, match="the API token changed"):
            rig.start()  # the client's token no longer opens the API
    else:
        assert on_disk == kept
        rig.start()  # the same token: the client that kept it is let in
