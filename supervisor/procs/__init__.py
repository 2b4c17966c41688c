"""Worker processes as the chaos runner and the daemon both start them: the pool (fresh
interpreters or forks of a warm template, one reaper per child) and the merged worker log."""
