"""Test only: a tool that starts a helper process and returns while the helper runs on, like a
tool that launches something in the background. The helper outlives the worker that started
it; it waits on the FIFO named by $ORPHAN_FIFO and exits once a writer has opened and closed it.
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from hermes.tools import ToolContext, tool

_HELPER = "import sys\nwith open(sys.argv[1], 'rb') as fifo:\n    fifo.read()\n"


@tool(policy="at_most_once")
def start_helper(ctx: ToolContext) -> dict[str, Any]:
    """Start the background helper; returns its pid."""
    helper = subprocess.Popen([sys.executable, "-c", _HELPER, os.environ["ORPHAN_FIFO"]], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
    return {"pid": helper.pid}
