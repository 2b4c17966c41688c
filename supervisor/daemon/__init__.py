"""The daemon: `hermes-supervisor serve` works through a durable inbox with supervised workers.

    service    the daemon loop: lease, watch, restart, drain
    restarts   what a worker's death means for its turn (backoff, crash loops)
    inbox      the turns table as an inbox, and the lock and status files next to the database
    log        the daemon's own log
    demo       the built-in demo model (only loaded without --base-url)
    cli        the serve, submit, status and result commands
"""
