"""`dstrace try`: the user's unchanged command as it is and with DeepSpeed config overrides, then compared.

`keys` reads and checks the overrides, `suggest` takes them from a finding of an analyzed run, `runs`
records both sides, `result` and `render` say what changed. The verb is `dstrace.commands.try_`.
"""
