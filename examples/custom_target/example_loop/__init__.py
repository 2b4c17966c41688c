"""An agent loop of the common kind, and its fix, as hermes-supervisor targets (see ../README.md)."""
