"""The V3 nodes: "ToMA Patch" and "ToMA Patch (Advanced)".

Both build a ToMASettings and call patching.patch_model, which clones the model, detects its
family and installs the hooks. Node ids and the order of inputs are part of every saved workflow
(widgets_values are positional): new inputs go last, nothing is renamed or reordered. The
families the description and tooltips name come from the registry (registry.py).
"""

from __future__ import annotations

from comfy_api.latest import io

from ...toma_core import BUDGETS, DESTINATIONS, PENALTY_RANGE, RATIO_RANGE, SIMILARITIES, UNMERGES, MergeSchedule
from ..families.registry import blocks_examples, node_models, video_models
from ..settings import (
    NODE_MIN_TOKENS,
    NODE_RATIO,
    NODE_SCOPE,
    NODE_START_PERCENT,
    NODE_TILE_FRAMES,
    NODE_TILE_SIZE,
    SCOPES,
    TEMPERATURE_RANGE,
    TILE_FRAMES_RANGE,
    TILE_SIZE_RANGE,
    ToMASettings,
)
from .input_checks import queued_input_errors
from .patching import patch_model

CATEGORY = "model_patches/ToMA"
DESCRIPTION = (
    f"Speeds up {node_models()} models by running their transformer blocks on fewer, merged image "
    "tokens (ToMA token merging) and spreading each block's change back to every token."
)
OUTPUT_TOOLTIP = "The model with ToMA token merging; the input model is left unchanged."


def basic_inputs() -> list:
    """Inputs shared by both nodes, in their saved order."""
    return [
        io.Model.Input("model", tooltip=f"The diffusion model to speed up ({node_models()})."),
        io.Float.Input(
            "ratio", default=NODE_RATIO, min=RATIO_RANGE[0], max=RATIO_RANGE[1], step=0.05,
            tooltip="Share of image tokens merged away inside the merged blocks. Higher is faster and "
            "less faithful; 0 leaves the output bit-identical.",
        ),
        io.Int.Input(
            "tile_size", default=NODE_TILE_SIZE, min=TILE_SIZE_RANGE[0], max=TILE_SIZE_RANGE[1],
            tooltip="Side of the square tiles, in tokens, within which tokens are merged. Small tiles keep "
            "merges local (fewer artifacts); any image size works.",
        ),
        io.Float.Input(
            "start_percent", default=NODE_START_PERCENT, min=0.0, max=1.0, step=0.01,
            tooltip="Point of the sampling run (sigma percent, 0 = first step) where merging starts. "
            f"{NODE_START_PERCENT:g} (default) leaves the first steps, which lay out the image, exact and merges the "
            "rest: about 1.3-1.4x end to end on Flux.1-dev and SDXL at 1024 px (predicted from real-size block "
            "timings). Lower it for more speed, raise it to keep more of the unpatched image.",
        ),
        io.Float.Input(
            "end_percent", default=1.0, min=0.0, max=1.0, step=0.01,
            tooltip="Point of the sampling run (sigma percent, 1 = last step) where merging stops. "
            "Stopping early leaves the last, detail-forming steps exact.",
        ),
        io.Int.Input(
            "recompute_every", default=1, min=1, max=1000,
            tooltip="Sampling steps between re-selections of the destination tokens; larger reuses the "
            "merge pattern across steps (faster, slightly less faithful). Counted in sampling steps, "
            "not merged steps: a pattern is reused only by merged steps fewer than this many steps after "
            "the one that chose it, so with merge_every >= recompute_every every merged step chooses afresh.",
        ),
    ]


def merge_every_input() -> io.Int.Input:
    """Last on both nodes: widgets_values of saved workflows are positional, so a new
    input goes after the existing ones and older workflows keep their values."""
    return io.Int.Input(
        "merge_every", default=1, min=1, max=1000,
        tooltip="Merge on every n-th sampling step inside the start/end window (the first step in "
        "it merges) and run the steps between unmerged; 1 = every step. The paper's Flux setting "
        "is 3 (steps 0, 3, 6, ...). Fewer merged steps: less speed-up, fewer merging errors. "
        "recompute_every counts sampling steps too, not merged steps.",
    )


def unmerge_input() -> io.Combo.Input:
    """After merge_every on the Advanced node (positional widgets_values, see merge_every_input)."""
    return io.Combo.Input(
        "unmerge", options=list(UNMERGES), default=UNMERGES[0],
        tooltip="How a merged block's result returns to every token. delta: each token keeps its "
        "own input and adds its destinations' change (closest to the unpatched image). hard: the "
        "change of its one most similar destination. output: its destinations' output, dropping "
        "its own detail (softer images).",
    )


def advanced_inputs() -> list:
    """Extra inputs of the advanced node."""
    return [
        io.String.Input(
            "blocks", default="auto",
            tooltip="Blocks that merge: 'auto' (recommended: the later half of the model, which keeps more of the "
            "image at the same speed than merging the early blocks too: each stream's later half on image DiTs, "
            "the output blocks on UNets; video models all but the first few blocks of each stream), 'all', or a list "
            f"such as {blocks_examples()}.",
        ),
        io.String.Input(
            "min_tokens", default=NODE_MIN_TOKENS, dynamic_prompts=False,
            tooltip="auto (default): a model call merges only where ToMA's cost model predicts it is "
            "faster for this model's width and this image size; small images and small models run "
            "unmerged (the log line says why). Where the prediction is too close to call, the run times "
            "an unmerged and a merged call of that size and the measurement decides (the log line says "
            "what it measured). A number: calls with fewer image tokens than this run unmerged; 0 = "
            "always merge.",
        ),
        io.Combo.Input(
            "similarity", options=list(SIMILARITIES), default=SIMILARITIES[0],
            tooltip="How token likeness is measured when picking destinations: cosine (paper), "
            "centered_cosine, or neg_sq_dist (k-medoids style).",
        ),
        io.Float.Input(
            "temperature", default=0.001, min=TEMPERATURE_RANGE[0], max=TEMPERATURE_RANGE[1], step=0.0005,
            tooltip="Softness of the token-to-destination assignment; 0.001 (paper) is nearly hard, "
            "0 is a hard nearest-destination assignment.",
        ),
        io.Combo.Input(
            "budget", options=list(BUDGETS), default=BUDGETS[0],
            tooltip="tile: every tile keeps the same share of tokens (paper). adaptive: the same total, "
            "shared out by content — flat regions give up more tokens, detailed ones keep more.",
        ),
        io.Boolean.Input(
            "proportional_attention", default=False,
            tooltip="Flux family only: each merged token weighs in attention as much as the tokens it "
            "stands for (log cluster size added to its attention logits). Closer to the unmerged "
            "attention; adds an attention bias, which some fast attention kernels do not take.",
        ),
        io.Combo.Input(
            "scope", options=list(SCOPES), default=NODE_SCOPE,
            tooltip="auto (default): the scope that keeps the most of the image at a given speed-up on "
            "this model's family (keys_values for video models, block for images). block: whole transformer blocks run on merged tokens (fastest). attention: only "
            "the attention runs merged, closer to the unpatched image and slower (UNet: self- and "
            "cross-attention; Flux family: double blocks' attention, single blocks whole, as the "
            "ToMA reference code). keys_values: every token keeps its query, residual and MLP; only "
            "the image keys and values of self-attention are merged, each weighing as the tokens it "
            "stands for (text and reference keys stay exact), so only attention gets cheaper: for "
            "long sequences (video, large images); every model family.",
        ),
        io.Boolean.Input(
            "verbose", default=False,
            tooltip="Log one line per model call (step, merge on/off, token grid) in addition to the "
            "per-run summary.",
        ),
    ]


def tile_frames_input() -> io.Int.Input:
    """Last on the advanced node: saved workflows keep their positional widget values."""
    return io.Int.Input(
        "tile_frames", default=NODE_TILE_FRAMES, min=TILE_FRAMES_RANGE[0], max=TILE_FRAMES_RANGE[1],
        tooltip=f"Video models ({video_models()}): latent frames a merge tile spans (tiles are tile_size x tile_size "
        "tokens x this many frames). 2 lets a token merge with its neighbour in the next frame; 1 "
        "merges within each frame only. Frame 0 never merges with later frames. Image models ignore it.",
    )


def destination_inputs() -> list:
    """Last on the advanced node, after tile_frames (positional widgets_values, see merge_every_input);
    optional, so an API prompt saved before they existed still validates and runs with their defaults."""
    return [
        io.Combo.Input(
            "destinations", options=list(DESTINATIONS), default=DESTINATIONS[0], optional=True,
            tooltip="How destination tokens are chosen when a step re-selects them. facility (paper): on the "
            "similarity of the tokens entering the first merged block. output_similarity (after DiTo): on "
            "the similarity of that block's output tokens at the previous model call (the first merged call "
            "of a run uses its input). docs/quality.md compares them.",
        ),
        io.Float.Input(
            "destination_penalty", default=0.0, min=PENALTY_RANGE[0], max=PENALTY_RANGE[1], step=0.05, optional=True,
            tooltip="Selection-frequency penalty: a token chosen as a destination by every earlier "
            "re-selection of this run must beat the other candidates by this share of the best gain to be "
            "chosen again, spreading destinations over the image. 0 (default) = no penalty.",
        ),
    ]


def build_settings(ratio, tile_size, start_percent, end_percent, recompute_every, merge_every, **advanced) -> ToMASettings:
    """ToMASettings from node inputs (ValueError naming the bad value and its range)."""
    schedule = MergeSchedule(float(start_percent), float(end_percent), recompute_every, merge_every)
    return ToMASettings(ratio=float(ratio), tile_size=int(tile_size), schedule=schedule, **advanced)


def node_schema(node_id: str, display_name: str, inputs: list) -> io.Schema:
    """The schema of a ToMA node: its id, name and inputs; category, description and the MODEL output shared."""
    return io.Schema(
        node_id=node_id,
        display_name=display_name,
        category=CATEGORY,
        description=DESCRIPTION,
        inputs=inputs,
        outputs=[io.Model.Output(tooltip=OUTPUT_TOOLTIP)],
    )


class ToMAPatch(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return node_schema("ToMAPatch", "ToMA Patch", basic_inputs() + [merge_every_input()])

    @classmethod
    def execute(cls, model, ratio, tile_size, start_percent, end_percent, recompute_every, merge_every) -> io.NodeOutput:
        settings = build_settings(
            ratio, tile_size, start_percent, end_percent, recompute_every, merge_every, min_tokens=NODE_MIN_TOKENS, scope=NODE_SCOPE,
        )
        return io.NodeOutput(patch_model(model, settings))


class ToMAPatchAdvanced(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return node_schema(
            "ToMAPatchAdvanced", "ToMA Patch (Advanced)", basic_inputs() + advanced_inputs() + [merge_every_input(), unmerge_input(), tile_frames_input()]
            + destination_inputs(),
        )

    @classmethod
    def validate_inputs(cls, blocks=None, min_tokens=None) -> bool | str:
        """ComfyUI's check of a queued prompt (comfy_api io.ComfyNode.validate_inputs; execution.validate_inputs):
        a bad `blocks` or `min_tokens` refuses the prompt (HTTP 400 from /prompt) before any model loads,
        with the message the node would raise when it runs (input_checks.py). Only the inputs named here
        skip ComfyUI's own checks, and text inputs have none. ComfyUI marks every input named here with
        the text returned (one validate_inputs per node), so each message starts with its input's name."""
        return "; ".join(queued_input_errors(blocks, min_tokens)) or True

    @classmethod
    def execute(
        cls, model, ratio, tile_size, start_percent, end_percent, recompute_every,
        blocks, min_tokens, similarity, temperature, budget, proportional_attention, scope, verbose, merge_every,
        unmerge, tile_frames=NODE_TILE_FRAMES, destinations=DESTINATIONS[0], destination_penalty=0.0,
    ) -> io.NodeOutput:
        settings = build_settings(
            ratio, tile_size, start_percent, end_percent, recompute_every, merge_every, blocks=blocks,
            min_tokens=min_tokens, similarity=similarity, temperature=float(temperature),
            budget=budget, proportional_attention=bool(proportional_attention), scope=scope,
            verbose=bool(verbose), unmerge=unmerge, tile_frames=int(tile_frames),
            destinations=destinations, destination_penalty=float(destination_penalty),
        )
        return io.NodeOutput(patch_model(model, settings))


NODES = [ToMAPatch, ToMAPatchAdvanced]
