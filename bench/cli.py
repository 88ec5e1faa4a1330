"""The benches' common command line: --device, --dtype, --attention, --profile, and the ComfyUI
import those options steer."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from harness import comfy_env

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def add_device_args(p: argparse.ArgumentParser) -> None:
    """--device and --dtype."""
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))


def add_kernel_args(p: argparse.ArgumentParser) -> None:
    """--attention and --profile."""
    p.add_argument("--attention", default="pytorch", choices=["pytorch", "comfy-default"],
                   help="pytorch: SDPA (what ComfyUI uses on GPUs); comfy-default: ComfyUI's CPU choice")
    p.add_argument("--profile", action="store_true", help="break a ToMA call at the first ratio into parts")


def import_comfy(args: argparse.Namespace) -> Path:
    """Import ComfyUI (cpu mode unless --device is not cpu) with the chosen attention kernel."""
    root = comfy_env.find_comfy_root()
    if root is None:
        sys.exit("ComfyUI not found: set COMFYUI_PATH")
    comfy_env.put_on_sys_path(root)
    import comfy.cli_args

    if args.attention == "pytorch":
        comfy.cli_args.args.use_pytorch_cross_attention = True
    if args.device != "cpu":
        os.environ["COMFYUI_USE_GPU"] = "1"
    result = comfy_env.import_comfy()
    if isinstance(result, str):
        sys.exit(result)
    return result


def run_header(root: Path, args: argparse.Namespace) -> str:
    """The start of a bench's first output line: ComfyUI version, device, dtype, threads, attention."""
    return (f"ComfyUI {comfy_env.comfy_version(root)}; device {args.device} {args.dtype}, "
            f"threads {torch.get_num_threads()}, attention {args.attention}; ")
