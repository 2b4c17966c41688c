"""The daemon: `hermes-supervisor serve` works through a durable inbox with supervised workers.

    service    the daemon loop: lease, watch, restart, drain
    launcher   how a worker is started for a turn: its command, its private files, the warm pool
    restarts   what a worker's death means for its turn (backoff, crash loops, limits)
    giving_up  ending a turn the daemon will not run again: failed, with a reason, well-formed
    cancels    cancel requests, kept durably until their turn has ended
    drain      SIGTERM/SIGINT: stop leasing, let the running turns end, then kill by recorded pid
    wakeup     the loop's self-pipe, and calls other threads queue for the loop
    inbox      the turns table as an inbox, and the lock, status and cancel files next to the database
    config     the daemon's settings, and `serve --config FILE` (TOML), checked before anything starts
    http/      the HTTP API (`serve --http`): submit, turns, event streams, cancel, health, metrics
    events     the event feed of a session, read from durable rows only (so every event sent is durable)
    metrics    the Prometheus metrics of GET /metrics
    log        the daemon's own log
    demo       the built-in demo model (only loaded without --base-url)
    systemd    readiness, stopping and watchdog notifications (sd_notify), when run by systemd
    cli        the serve, submit, status and result commands: parsing and dispatch
    cli_serve  `serve`: its settings, each checked before anything starts
    cli_inbox  `submit`, `status` and `result`
    cli_shared their exit codes, --db and --store, and a store out of reach said in one line
"""
