"""The run folder, dstrace's one interface: record writes it, analyze, compare, view and gather read it,
and users mail it to each other. This package owns its file names (`names`), its records and their
schemas (`records`), how its files are written (`files`) and read (`untrusted`), the folder itself read
once (`folder.RunFolder`), and the names of dstrace's ranges in a trace (`range_names`), which the
recording writes and the analysis reads; nothing here imports from the rest of dstrace, and it needs
only the standard library where the recording runs (inside the job)."""
