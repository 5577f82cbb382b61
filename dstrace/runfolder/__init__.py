"""The run folder, dstrace's one interface: record writes it, analyze, compare, view and gather read it,
and users mail it to each other. This package owns its file names (`names`), its records and their
schemas (`records`), and how its files are written and read (`files`); nothing here imports from the
rest of dstrace, and it needs only the standard library where the recording runs (inside the job)."""
