"""dstrace: record every rank of a distributed PyTorch / DeepSpeed inference run and explain its time."""
__version__ = "0.1.0"
