"""Rows of token tensors taken by index: a plan's destinations (`take_destinations`, positional
rows such as rope tables) and the per-sample gathers merge and unmerge run (`take_rows`,
`select_rows`); gathers only, no scatter."""

from __future__ import annotations

import torch


def take_destinations(rows: torch.Tensor, index: torch.Tensor, dim: int) -> torch.Tensor:
    """rows with N on `dim` (batch 1 or B in dim 0), index (B, D) -> the indexed rows, D on `dim`.

    Batch-1 rows (rope tables) take one index_select, not advanced indexing (several times slower
    on the CPU for Wan's (1, N, 1, C/2, 2, 2) table).
    """
    moved = rows.movedim(dim, 1)
    index = index.to(rows.device)
    if moved.shape[0] == 1:
        taken = moved[0].index_select(0, index.flatten()).view(*index.shape, *moved.shape[2:])
    else:
        taken = moved[torch.arange(index.shape[0], device=rows.device).unsqueeze(-1), index]
    return taken.movedim(1, dim)


def take_rows(x: torch.Tensor, index: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x (B, L, C), index (B or 1, M) -> (B, M, C), into `out` if given: rows of each sample (a
    gather, no scatter; an index_select when every sample takes the same rows)."""
    index = index.to(x.device)
    if index.shape[0] == 1:
        return select_rows(x, index[0], out)
    rows = index.unsqueeze(-1).expand(-1, -1, x.shape[-1])
    if out is None or out.is_contiguous():
        return torch.gather(x, 1, rows, out=out)
    return out.copy_(x.gather(1, rows))


def select_rows(x: torch.Tensor, index: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x (B, L, C), index (M,) -> (B, M, C), into `out` if given. torch.compile takes only a
    contiguous out= tensor: a strided one (a slice of a batch above 1) gets a copy instead."""
    if out is None or out.is_contiguous():
        return torch.index_select(x, 1, index, out=out)
    return out.copy_(x.index_select(1, index))
