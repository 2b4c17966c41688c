"""Benchmarks: what durability and chaos cost, measured (`python -m bench`, `scripts/bench.py`,
`hermes-supervisor bench`).

Every figure is printed next to a reference measured in the same run on the same
machine, as a ratio, with its target and PASS/FAIL. Timings are medians of repeated
runs; paired measurements are interleaved (A B A B ...) so drift and noise from other
load hit both sides alike.

    flush        one message appended by AIAgent._flush_messages_to_session_db to a leased
                 session with 10 prior rows, against a bare BEGIN IMMEDIATE; INSERT; COMMIT
                 of the same row (same columns, same values) into a table of the same schema
                 (all of SessionDB's tables and indexes, same pragmas) in a file of its own in
                 the same directory, with raw sqlite3 calls; again against a minimal 2-column
                 table (informative). At synchronous=FULL and NORMAL. After each sample both
                 sides delete the row they added (untimed), so every sample appends to exactly
                 10 prior rows.
    growth       the same flush with 10,000 prior rows against 10 prior rows.
    upstream     upstream hermes-agent's flush on the same workload, when it is installed.
    resume       resume_interrupted_turn on a 10,000-row session whose running turn ends in
                 its user row, until the model.request probe (load + reconcile + building the
                 request); reference: a bare SELECT of the same rows.
    recovery     SIGKILL of a worker blocked at tool.dispatch.after -> the resumed worker's next
                 model request arriving at the scripted model server, through Pool(forkserver=True)
                 against Pool(forkserver=False); each stage against the step of the machine's floor
                 it cannot beat, and the whole against that floor.
    floor        (inside recovery and campaign, same run) bare fork/_exit/waitpid, an fsynced SQLite
                 commit, a loopback HTTP round trip (kept and new connection), a fork of the warm
                 template to its reap (bench.floor).
    campaign     exhaustive chaos cases per second per scenario (Campaign in-process, jobs=2);
                 reference: no-op worker cycles per second through the same kind of pool; the
                 demo's whole campaign (every scenario at once) against that floor; upstream's.
    peers        the durability cost of one tool call: ours, LangGraph (SqliteSaver, durability
                 "sync") and the Agents SDK (SQLiteSession), the same no-op tool N times in one turn
                 against the same scripted model, each durable and without its durability.
    daemon       turns per second and p50/p99 latency through `hermes-supervisor serve`.
    memory       supervisor RSS at 10%, 50%, 100% of a random campaign; worker RSS.
    powerloss    (only with --only powerloss: it needs FUSE) an exhaustive campaign of one scenario
                 with power cuts against the same campaign with process kills, side by side, per
                 case; where the extra time goes; what FULL and NORMAL keep through the cuts.
    fleet        (only with --only fleet: it needs PostgreSQL) the same backlog through one SQLite
                 daemon and through 1, 2 and 4 daemons of a fleet on one PostgreSQL store, side
                 by side: turns/s, submit -> answer p50/p99, CPU per turn.

The full bench also draws two SVG charts into docs/figures (`bench.charts`, matplotlib from the
`bench` extra): flush cost against transcript length, ours and upstream's, and every recovery
sample of both pool kinds.

One module per benchmark; `bench.table` holds the figures and prints them, `bench.cli`
parses the arguments and runs the sections. Nothing under supervisor/ imports this package.
"""
