"""Sets of ranks written as ranges, so a world of hundreds of ranks stays one line."""
from __future__ import annotations


def ranges(ranks) -> str:
    """0-3, 7, 9-12 (two in a row stay 0, 1)."""
    ranks = sorted(set(int(r) for r in ranks))
    out, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(str(start) if start == r else f"{start}, {r}" if r == start + 1 else f"{start}-{r}")
            start = None
    return ", ".join(out)


def ranks_text(ranks) -> str:
    """rank 3; ranks 0-3, 7, 9-12."""
    ranks = set(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ranges(ranks)


def by_rank_lines(said: dict[int, str]) -> list[str]:
    """`ranks 0-3: <text>`, each text once with every rank it was said of (rank -> text), in rank order."""
    grouped: dict[str, list[int]] = {}
    for rank, text in sorted(said.items()):
        grouped.setdefault(text, []).append(rank)
    return [f"{ranks_text(ranks)}: {text}" for text, ranks in grouped.items()]
