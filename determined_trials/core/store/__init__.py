"""The local store: the SQLite database that plays the cluster master's part.

Owns the schema (``_schema``), the writes (``_local``: ``LocalStore``), the reads and their record types
(``_reads``, ``_records``), training reports held and stored a second at a time (``_report_buffer``),
experiment owners (``_owner``: pid + start time), settling checkpoints a killed writer left
(``_checkpoint_recovery``) and the checkpoint retention policy that the runner and a plain ``fit`` share
(``_retention``).

``core.storage`` to delete and settle checkpoint folders. Never ``core.transport`` or ``core.channel`` (the
network sits above the store), nor any framework.

May import: errors, config, core.storage
"""
