"""Supervisor package: chaos-testing harness and its scripted model server."""
