"""The chaos harness in Jepsen's rooms: scenarios and the generator plan cases, the nemesis
breaks things, the runner plays one case, the history records it, the checker judges it,
the report shows it, and the campaign ties them together."""
