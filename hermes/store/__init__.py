"""The durable transcript's storage, split by what each part owns.

``hermes.state`` is the facade everyone imports: its ``SessionDB`` is one class made of
the mixins here (``connection``: the SQLite connection, busy retry, write transactions and
fencing; ``messages``; ``turns`` and the daemon inbox; ``dispatches``), ``schema`` holds
the tables, and ``snapshot`` the read-only ways in.
"""
