"""Test kit: the scripted OpenAI-compatible model (its scripts and its loopback server)."""
