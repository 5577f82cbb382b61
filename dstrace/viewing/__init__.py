"""dstrace's views of a run: its timelines in TensorBoard or Perfetto, or its report in a browser.

Each view is its own module: `tensorboard` (serve the run to the PyTorch profiler plugin), `timeline` +
`perfetto` (one merged, clock-aligned trace of all ranks: `perfetto.write_merged_trace`) and `report`
(the HTML report of `analyze`). The `dstrace view` verb is `dstrace.commands.view`.
"""
