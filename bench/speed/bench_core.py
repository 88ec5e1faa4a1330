"""Core overhead of ToMA: make_plan + merge + unmerge against one Flux-width transformer block.

    python -m bench.speed.bench_core                      # CPU, hidden 3072, 4096 tokens, ratio 0.5, tile 4
    python -m bench.speed.bench_core --device cuda --dtype bf16

Prints the median milliseconds of each piece and the overhead as a percentage of one unmerged
block forward on the same tokens (the target: under 5 % at ratio 0.5, tile 4, 4096 tokens).
"""

from __future__ import annotations

import argparse

import torch

from toma_core import make_plan

from .. import timing
from ..cli import DTYPES


class FluxWidthBlock(torch.nn.Module):
    """A single-stream DiT block (Flux's layout): LayerNorm, fused QKV + MLP-in, attention, fused out."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm = torch.nn.LayerNorm(width, elementwise_affine=False)
        self.linear1 = torch.nn.Linear(width, 3 * width + 4 * width)
        self.linear2 = torch.nn.Linear(width + 4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, N, C) -> (B, N, C)."""
        width = x.shape[-1]
        qkv, mlp = self.linear1(self.norm(x)).split([3 * width, 4 * width], dim=-1)
        q, k, v = qkv.unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)
        attn = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)
        return x + self.linear2(torch.cat([attn, torch.nn.functional.gelu(mlp, approximate="tanh")], dim=-1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    parser.add_argument("--width", type=int, default=3072)
    parser.add_argument("--grid", type=int, default=64, help="tokens per side (64 -> 4096 tokens)")
    parser.add_argument("--ratio", type=float, default=0.5)
    parser.add_argument("--tile-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.exit(2, "error: --device cuda asked for, but torch sees no CUDA device (use --device cpu)\n")
    torch.manual_seed(0)
    dtype, n = DTYPES[args.dtype], args.grid * args.grid
    block = FluxWidthBlock(args.width, max(1, args.width // 128)).to(args.device, dtype)
    x = torch.randn(1, n, args.width, device=args.device, dtype=dtype)
    with torch.inference_mode():
        plan = make_plan(x, args.grid, args.grid, args.ratio, args.tile_size)
        merged = plan.merge(x)
        pieces = {
            "block (N tokens)": lambda: block(x),
            "make_plan": lambda: make_plan(x, args.grid, args.grid, args.ratio, args.tile_size),
            "merge": lambda: plan.merge(x),
            "unmerge_residual": lambda: plan.unmerge_residual(x, merged, merged),
            "block (D tokens)": lambda: block(merged),
        }
        ms = timing.median_ms(pieces, args.device, warmup=1, repeats=args.repeats)
    block_ms = ms["block (N tokens)"]
    overhead = ms["make_plan"] + ms["merge"] + ms["unmerge_residual"]
    print(f"device={args.device} dtype={args.dtype} width={args.width} tokens={n} D={plan.num_kept} "
          f"ratio={args.ratio} tile={args.tile_size} torch={torch.__version__} threads={torch.get_num_threads()}")
    print("| piece | median ms | % of one block |")
    print("|---|---:|---:|")
    for name, value in ms.items():
        print(f"| {name} | {value:.2f} | {100 * value / block_ms:.2f}% |")
    print(f"| make_plan + merge + unmerge | {overhead:.2f} | {100 * overhead / block_ms:.2f}% |")
    per_block = ms["merge"] + ms["unmerge_residual"]
    print(f"| merge + unmerge (per reused block) | {per_block:.2f} | {100 * per_block / block_ms:.2f}% |")


if __name__ == "__main__":
    main()
