"""Deliberate defect: a file replaced by a rename is never followed by an fsync of its directory.

`hermes.private_files.replace_file_durably` writes a temp file, fsyncs it, renames it over the
file it replaces and then fsyncs the directory. Here the last step is skipped: the new bytes
are durable, their name is not. Armed in every process that imports the runtime (the daemon
writes its API token, its status file and its cancel requests this way). A process kill cannot
tell, since the kernel keeps the rename; a power cut on a mount without ``dirsync`` undoes it,
and the daemon's token file, which clients keep, is gone: the next daemon makes a new one and
locks every client that kept the old one out. tests/test_power_loss_renames.py shows it.
"""
import os
import sys

DEFECT = "rename-not-dir-synced"


def _arm() -> None:
    from hermes import private_files

    def replace_without_dir_fsync(path, text):
        path = private_files.Path(path)
        temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        private_files.write_private(temp, text, fsync=True)
        os.replace(temp, path)  # no fsync_dir(path.parent) after it: the defect

    private_files.replace_file_durably = replace_without_dir_fsync
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


_arm()
