"""The supervisor: chaos campaigns and checks (`chaos/`), the daemon (`daemon/`), the worker processes
both start (`procs/`), the systems under test (`targets.py`), and `hermes-supervisor` (`cli.py`)."""
