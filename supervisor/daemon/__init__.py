"""The daemon: `hermes-supervisor serve` works through a durable inbox with supervised workers.

    service    the daemon loop: lease, watch, restart, drain
    restarts   what a worker's death means for its turn (backoff, crash loops)
    inbox      the turns table as an inbox, and the lock and status files next to the database
    log        the daemon's own log
    demo       the built-in demo model (only loaded without --base-url)
    config     `serve --config FILE`: the settings in a TOML file, checked before anything starts
    systemd    readiness, stopping and watchdog notifications (sd_notify), when run by systemd
    cli        the serve, submit, status and result commands
"""
