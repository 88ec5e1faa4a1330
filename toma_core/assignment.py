"""How a plan assigns each token to its tile's destinations (ToMA §3.3): the soft assignment P
(`assignment`), its hard forms (`own_destinations`, `hard_assignment`), and the "adaptive" budget's
share of the destinations over a sample's tiles (`adaptive_slots`). Layouts: (B, G, k, n), G tiles
of n tokens with k destination slots each."""

from __future__ import annotations

import torch


def adaptive_slots(gains: torch.Tensor, num_kept: int) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Share one budget of D destinations over all tiles of a sample by greedy gain.

    gains (B, G, k): the marginal facility-location gain of each tile's picks, in pick order.
    Every tile keeps its first pick; the other D - G slots go to the largest gains of the whole
    sample, so flat regions give up more tokens than detailed ones (as ToMe's global budget
    does), while merging stays tile-local. Returns slot_valid (B, G, k), exactly D per sample,
    and its maps (kept (B, D), source (B, G*k)); static shapes (topk, no nonzero).
    """
    g, k = gains.shape[-2:]
    key = gains.double()
    key[..., 0] = 1e12
    key = key.masked_fill(gains < 0, -1e12)
    # Distinct keys (ties to the earlier tile and pick) make the count exactly D.
    key = (key - torch.arange(g * k, device=gains.device, dtype=torch.float64).view(g, k) * 1e-12).flatten(1)
    valid = key >= key.topk(num_kept, dim=1).values[:, -1:]
    positions = torch.arange(g * k, device=gains.device)
    kept = torch.where(valid, positions - g * k, positions).topk(num_kept, dim=1, largest=False).indices
    source = (valid.long().cumsum(1) - 1).clamp_min(0)
    return valid.view(-1, g, k), (kept, source)


def assignment(dst_sim: torch.Tensor, slot_valid: torch.Tensor, temperature: float) -> torch.Tensor:
    """Soft assignment P (B, G, k, n) of each token over its tile's destinations (softmax over k)."""
    logits = dst_sim.masked_fill(~slot_valid.unsqueeze(-1), float("-inf"))
    if temperature == 0:
        best = logits.argmax(dim=-2, keepdim=True)
        slots = torch.arange(logits.shape[-2], device=logits.device).view(-1, 1)
        return (slots == best).float()
    # A tiny temperature (1e-300 is legal) must not give NaN: shifted by each token's best
    # destination, logits / temperature cannot overflow to +inf, and the temperature is clamped
    # to the smallest normal float of the logits' dtype, which it would otherwise round to 0.
    # In place on the fresh logits: the same arithmetic, two (B, G, k, n) buffers fewer.
    shifted = logits.sub_(logits.amax(dim=-2, keepdim=True))
    return torch.softmax(shifted.div_(max(temperature, torch.finfo(logits.dtype).tiny)), dim=-2)


def own_destinations(assign: torch.Tensor, dst: torch.Tensor, slot_valid: torch.Tensor) -> torch.Tensor:
    """Hard assignment (B, G, k, n) with every used destination pinned to its own token.

    A tile of identical tokens yields distinct but identical destinations; argmax ties would send
    all of them to the first, leaving the others empty (an all-zero merged token).
    """
    positions = torch.arange(assign.shape[-1], device=assign.device)
    own = (dst.unsqueeze(-1) == positions).float() * slot_valid.unsqueeze(-1)
    return torch.where(own.amax(dim=-2, keepdim=True) > 0, own, assign)


def hard_assignment(assign: torch.Tensor) -> torch.Tensor:
    """(B, G, k, n) soft assignment -> one-hot on each token's largest weight (zero columns stay zero)."""
    best = assign.argmax(dim=-2, keepdim=True)
    slots = torch.arange(assign.shape[-2], device=assign.device).view(-1, 1)
    return ((slots == best) & (assign.sum(-2, keepdim=True) > 0)).to(assign.dtype)


def balanced_assignment(logits: torch.Tensor, slot_valid: torch.Tensor, real: torch.Tensor, iterations: int = 24) -> torch.Tensor:
    """The soft assignment (B, G, k, n) nearest to softmax(logits) over k whose every valid slot of a
    tile stands for the same number of tokens, n_real / k_valid: log-domain Sinkhorn iterations
    (Cuturi, NeurIPS 2013), alternating the token normalisation (each token's weights sum to 1) with
    the destination-mass one, ending on the latter so the masses are equal to rounding.

    logits (B, G, k, n): similarity / temperature of each slot to each token; slot_valid (B|1, G, k);
    real (B|1, G, n) the tile's real (not padded) tokens. Batched elementwise and logsumexp only.
    """
    valid_row = slot_valid.unsqueeze(-1)
    real_col = real.unsqueeze(-2)
    inside = valid_row & real_col
    neg = torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device)
    log_p = torch.where(inside, logits, neg)
    log_mass = (real.sum(-1).clamp_min(1) / slot_valid.sum(-1).clamp_min(1)).to(logits.dtype).log()[..., None, None]
    for step in range(2 * iterations + 1):
        if step % 2 == 0:  # tokens: softmax over the tile's slots
            log_p = torch.where(inside, log_p - log_p.logsumexp(-2, keepdim=True), neg)
        else:  # destinations: each slot's mass n_real / k_valid
            log_p = torch.where(inside, log_p + log_mass - log_p.logsumexp(-1, keepdim=True), neg)
    return torch.where(inside, log_p + log_mass - log_p.logsumexp(-1, keepdim=True), neg).exp()
