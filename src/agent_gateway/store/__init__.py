"""The storage floor's infrastructure: what every area's SQL stands on.

The engine and its transactions (``engine``), SQLite on the event loop
(``sqlite``) and its WAL checkpoints (``wal``), statements straight on the
driver (``direct``), wake-ups after commit (``notifications``), leadership,
the woken-loop skeleton (``woken``), group commit (``batch``), vacuum, the
errors that mean the database cannot be reached (``unavailable``), cursor
windows over a numbered log (``window``), the schema (``tables``) and its
migrations (``migrate``, ``migrations/``). Each area's SQL is one module of
``store.queries``. Nothing here imports ``store.queries`` or a package above
the store; only the neutral leaves at the package top (``errors``,
``jsontext``, ``clock``, ``merkle``), which import nothing of the gateway.
"""
