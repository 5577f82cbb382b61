"""The verbs: one module a `dstrace` verb, each with `add_arguments(parser)` and `main(args) -> int`.

This floor sits on top of the house. A verb parses its options, calls the floors below it (recording,
analysis, comparison, viewing, trying) and says what happened; the work is theirs. `dstrace.cli` alone
imports this package, one verb at a time, and nothing below imports it: so `record` composes recording
with the analysis' per-rank reduction without recording and analysis importing each other.
"""
