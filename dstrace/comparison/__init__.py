"""Repeated runs of several configurations, side by side (`dstrace compare`, `dstrace sweep`).

`collect` finds run folders and groups them by configuration (the only file reading besides the
analysis' own loading), `facts` turns one recorded run into the numbers a comparison needs, `stats`
holds the spread and the indistinguishability rule, `verdict` states what the evidence shows,
`compare.compare_runs` is the whole comparison, `render` writes text, markdown or JSON, `spec` reads a
sweep spec and `sweep` records it. The verbs are `dstrace.commands.compare` and `dstrace.commands.sweep`.
"""
