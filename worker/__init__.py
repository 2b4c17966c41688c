"""worker: one OS process that runs or resumes the turns of one agent session."""
