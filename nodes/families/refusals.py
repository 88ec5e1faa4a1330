"""The model families ToMA knows and refuses, each with the reason the node's error gives
(registry.family_of raises it); every diffusion class of ComfyUI 0.33 is either a registry Family
or here (tests/integration/test_supported_models.py), and docs/compatibility.md lists them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Refusal:
    """A known model family ToMA refuses, with the reason the node gives."""

    title: str
    classes: tuple[str, ...]
    reason: str


REFUSED: tuple[Refusal, ...] = (
    Refusal(
        "LTX-2 (LTXAV)", ("comfy.ldm.lightricks.av_model:LTXAVModel",),
        "its blocks run joint audio and video token streams with per-token modulation under a noise mask, "
        "so merged video tokens would need their own timestep embeddings and audio cross-attention rows",
    ),
    Refusal(
        "MiniMax H3", ("comfy.ldm.minimax.model:MiniMaxH3Model",),
        "it packs text, reference, audio and video tokens in one sequence with per-token timesteps, so "
        "merged video tokens would need their own timestep embeddings",
    ),
    Refusal(
        "LTXV", ("comfy.ldm.lightricks.model:LTXVModel",),
        "its modulation is per token under a noise mask (image-to-video, keyframe guides), so merged "
        "tokens would need their own timestep embeddings, and keyframe tokens carry rope positions "
        "off the latent grid",
    ),
    Refusal(
        "Anima", ("comfy.ldm.anima.model:Anima",),
        "it runs Cosmos Predict2 blocks, which take the latent as a 5-D (B, T, H, W, C) grid with "
        "per-frame modulation that a token merge cannot hand them",
    ),
    Refusal(
        "Cosmos", ("comfy.ldm.cosmos.predict2:MiniTrainDIT", "comfy.ldm.cosmos.model:GeneralDIT"),
        "its blocks take the latent as a 5-D (B, T, H, W, C) grid with per-frame modulation, which a "
        "token merge cannot hand them",
    ),
    Refusal(
        "Wan CausalAR", ("comfy.ldm.wan.ar_model:CausalWanModel",),
        "its causal self-attention reads a KV cache of earlier frame chunks across calls, so merged "
        "tokens would corrupt the cache the next chunk attends to",
    ),
    Refusal(
        "Wan SCAIL", ("comfy.ldm.wan.model:SCAILWanModel",),
        "its blocks run reference frames before and pose tokens after the video tokens in one sequence; "
        "not adapted yet: an adapter would need to pass both spans through unmerged",
    ),
    Refusal(
        "Wan Animate / Animate2 / WanDancer / HuMo / Camera",
        ("comfy.ldm.wan.model_animate:AnimateWanModel", "comfy.ldm.wan.model_animate2:WanAnimate2Model", "comfy.ldm.wan.model_wandancer:WanDancerModel", "comfy.ldm.wan.model:HumoWanModel", "comfy.ldm.wan.model:CameraWanModel",),
        "it adds face, pose, music, audio or camera features to the video tokens between or inside the "
        "blocks outside the Wan block call; not adapted yet: an adapter would need those injections to "
        "see the merged tokens",
    ),
    Refusal(
        "HiDream-O1", ("comfy.ldm.hidream_o1.model:HiDreamO1Transformer",),
        "its image patches run inside a Qwen3-VL decoder as one text+image sequence with interleaved "
        "MRoPE positions; not adapted yet: an adapter would need to hook the decoder layers and their rope",
    ),
    Refusal(
        "SeedVR2", ("comfy.ldm.seedvr.model:NaDiT",),
        "its blocks take packed variable-length video and text sequences with window attention over "
        "shifted windows; not adapted yet: an adapter would need to merge inside each window",
    ),
    Refusal(
        "PixelDiT / PiD", ("comfy.ldm.pixeldit.model:PixDiT_T2I",),
        "its pixel blocks run one sequence per patch, conditioned on each patch token; not adapted "
        "yet: an adapter would merge only its patch blocks and unmerge before the pixel blocks",
    ),
    Refusal(
        "Joint-sequence DiTs: Krea2, ErnieImage, Ideogram4, OmniGen2, Boogu",
        ("comfy.ldm.krea2.model:SingleStreamDiT", "comfy.ldm.ernie.model:ErnieImageModel", "comfy.ldm.ideogram4.model:Ideogram4Transformer2DModel", "comfy.ldm.boogu.model:BooguTransformer2DModel", "comfy.ldm.omnigen.omnigen2:OmniGen2Transformer2DModel",),
        "not adapted yet: an adapter would need the image span of its joint text+image sequence, its "
        "rope table's layout and its blocks' signature (each differs from the supported families)",
    ),
    Refusal(
        "Two-stream DiTs: JoyImage, MageFlow, Lens, AuraFlow, Mochi, CogVideoX",
        ("comfy.ldm.joyimage.model:JoyImageTransformer3DModel", "comfy.ldm.mage_flow.model:MageFlowTransformer2DModel", "comfy.ldm.lens.model:LensTransformer2DModel", "comfy.ldm.aura.mmdit:MMDiT", "comfy.ldm.genmo.joint_model.asymm_models_joint:AsymmDiTJoint", "comfy.ldm.cogvideo.model:CogVideoXTransformer3DModel",),
        "not adapted yet: an adapter would need a block hook for its own image/text stream signature "
        "and rope layout (the Flux and Qwen-Image adapters match their own classes, not these)",
    ),
    Refusal(
        "Cross-attention DiTs: PixArt, HunyuanDiT",
        ("comfy.ldm.pixart.pixartms:PixArtMS", "comfy.ldm.hydit.models:HunYuanDiT"),
        "not adapted yet: an adapter would need a hook for its self-attention block (text enters by "
        "cross-attention) and, for HunyuanDiT, its long skip connections between blocks",
    ),
    Refusal(
        "Stable Cascade", ("comfy.ldm.cascade.stage_c:StageC", "comfy.ldm.cascade.stage_b:StageB"),
        "not adapted yet: its ResBlock/attention stages would need their own hook (the UNet adapter "
        "patches `BasicTransformerBlock`s, which it has none of)",
    ),
    Refusal(
        "Audio, 3-D and vision models",
        ("comfy.ldm.audio.dit:AudioDiffusionTransformer", "comfy.ldm.ace.model:ACEStepTransformer2DModel", "comfy.ldm.ace.ace_step15:AceStepConditionGenerationModel", "comfy.ldm.minimax_music.dit:MiniMaxMusic3DiT", "comfy.ldm.hunyuan3d.model:Hunyuan3Dv2", "comfy.ldm.hunyuan3dv2_1.hunyuandit:HunYuanDiTPlain", "comfy.ldm.triposplat.model:LatentSeqMMFlowModel", "comfy.ldm.trellis2.model:Trellis2", "comfy.ldm.sam3.detector:SAM3Model", "comfy.ldm.rt_detr.rtdetr_v4:RTv4", "comfy.ldm.depth_anything_3.model:DepthAnything3Net",),
        "their tokens are audio frames, 3-D latents or detector features, not an image grid, so ToMA's "
        "2-D tiles have nothing to tile",
    ),
)
