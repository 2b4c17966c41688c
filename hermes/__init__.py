"""hermes: an agent runtime whose transcript survives kill -9."""
