"""The attention kernels users select, as contracts: which head sizes each runs, at what bucket, how
fast against PyTorch SDPA, and what it does with a head size it does not take. The keys/values
scope (keys_values.py) changes a self-attention's key count and, with the log-mass channel, its head
size; this table says which merged form each kernel runs at no dearer bucket than the unmerged call.

Read from the kernels' own sources (../shared/research/attention_kernels.md has the line numbers):
  SDPA / FlashAttention 2 <= 2.7: flash_api.cpp rounds the head to a multiple of 8, then to the
    kernels of static_switch.h (32, 64, 96, 128, 160, 192, 256); PyTorch's flash path is the same
    kernel (sdp_utils.cpp check_head_dim_size_flash: <= 256, multiple of 8).
  FlashAttention 2 >= 2.8: the 160 kernel is gone (136 runs at 192).
  FlashAttention 3 (hopper/flash_api.cpp round_up_headdim): 64, 96, 128, 192, 256.
  SageAttention 2 / 2++ (thu-ml/SageAttention sageattention/core.py): pads a head below 64 to 64 and
    below 128 to 128; above 128 raises ValueError("Unsupported head_dim").
  SageAttention 1.0.6 (PyPI, Triton core.py): 64 / 96 / 128; above 128 an assertion.
  SageAttention 3 (Blackwell api.cu): 64 / 128 / 256 only.
  comfy-kitchen int8 (ComfyUI 0.33 attention_comfy_kitchen_int8): pads to 128 or 256.
  SpargeAttn (spas_sage_attn/core.py): `assert headdim in [64, 128]`.
  ComfyUI attention_split / sub_quad / basic: plain matmuls, cost linear in the head size.

Speed against SDPA's FlashAttention 2 at a native head (published): SageAttention 1 about 2.1x
(ICLR 2025), SageAttention 2 about 3x on an RTX 4090 and 2++ about 3.9x (arXiv 2505.21136),
SageAttention 3 about 5x FlashAttention on an RTX 5090 (arXiv 2505.11594), FlashAttention 3 about
1.5-2x FlashAttention 2 on an H100 (arXiv 2407.08608, fp16). Not published, assumed: comfy-kitchen's
int8 attention at 2.0 (an int8 Q K^T like SageAttention 1's) and SpargeAttn at SageAttention 2's 3.0
(its dense kernel; the blocks it skips are not priced).
"""

from __future__ import annotations

from dataclasses import dataclass

MATMUL = "matmul"
"""A kernel whose cost grows with the head size itself (no buckets): ComfyUI's split / sub_quad /
basic attention, and SDPA's math path on a CPU."""


@dataclass(frozen=True)
class Kernel:
    """One attention kernel's head-size contract.

    buckets: the head sizes it runs, ascending: a call at head e runs at the smallest bucket >= e
    (its cost is the bucket's); () for MATMUL kernels, which run any head at its own size.
    refuses: whether a head above the last bucket (or between buckets, for `exact`) raises instead
    of running. exact: only the listed sizes run (no padding up to a bucket).
    speed: attention throughput against SDPA's FlashAttention 2 at a native head (1.0 = SDPA).
    """

    name: str
    buckets: tuple[int, ...]
    speed: float = 1.0
    refuses: bool = False
    exact: bool = False

    def bucket(self, head: int) -> int | None:
        """The head size a call at `head` runs at; None when the kernel refuses it."""
        if not self.buckets:
            return head
        for size in self.buckets:
            if head == size or (head < size and not self.exact):
                return size
        return None if self.refuses else head

    def takes(self, head: int) -> bool:
        return self.bucket(head) is not None

    def cost_ratio(self, head: int, wider: int) -> float | None:
        """The attention cost of a call at head `wider` against one at `head`: bucket over bucket
        (1.0 when both land in one bucket); None when the kernel refuses `wider`."""
        base, other = self.bucket(head), self.bucket(wider)
        if other is None or base is None:
            return None
        return other / base


KERNELS: dict[str, Kernel] = {
    kernel.name: kernel
    for kernel in (
        Kernel("sdpa", (32, 64, 96, 128, 160, 192, 256)),
        Kernel("flash2", (32, 64, 96, 128, 160, 192, 256)),
        Kernel("flash2.8", (32, 64, 96, 128, 192, 256)),
        Kernel("flash3", (64, 96, 128, 192, 256), speed=1.5),
        Kernel("xformers", (32, 64, 96, 128, 160, 192, 256)),
        Kernel("sage1", (64, 96, 128), speed=2.1, refuses=True),
        Kernel("sage2", (64, 128), speed=3.0, refuses=True),
        Kernel("sage3", (64, 128, 256), speed=5.0, refuses=True, exact=True),
        Kernel("kitchen_int8", (128, 256), speed=2.0),
        Kernel("sparge", (64, 128), speed=3.0, refuses=True, exact=True),
        Kernel(MATMUL, ()),
    )
}
"""Every kernel the pack knows, by name (the names the run line and the cost model use)."""
