"""The registry of pretrained presets: data only, nothing is built or downloaded here.

Each preset names a checkpoint the ViT authors released, as it is published
on the Hugging Face hub today:

- the paper's original checkpoints (Dosovitskiy et al., 2021) in Hugging Face
  `transformers` format under the `google` organisation;
- the "How to train your ViT" (AugReg, Steiner et al., 2021) checkpoints in
  timm safetensors format under the `timm` organisation, named
  `timm/<architecture>.<tag>` exactly as timm's pretrained configs spell them;
- the paper's R50+ViT-B/16 hybrid (a BiT ResNet-50 stem, section 3.1), which
  exists on the hub only in timm format (`timm/vit_base_r50_s16_*.orig_*`).

Fields of an entry:

- `description`: one line for `keras-vit presets`.
- `variant`, `image_size`: the architecture (`ViTBackbone.from_variant`).
- `config`: constructor overrides the checkpoint needs (Hugging Face models
  use LayerNorm epsilon 1e-12).
- `num_classes`: classes of the released head, or `None` when the checkpoint
  has no usable head (the original ImageNet-21k releases had their heads
  zeroed); `class_names`: `"imagenet-1k"` for the 1000 ImageNet classes.
- `pixel_mean`, `pixel_std`: preprocessing after scaling pixels to [0, 1].
- `source` (`hf://org/repo`), `format` (`"huggingface"` or `"timm"`),
  `revision` (a commit or ref on the hub; `None` means `main`), `sha256` of the
  weights file where it could be read from the hub's published LFS pointer
  (`None` otherwise: the download is then checked by size and file format).
- `config` also carries the source's evaluation transform (`resize_mode`,
  `crop_fraction`, `interpolation`, `alpha`): the original checkpoints'
  `preprocessor_config.json` (ViTImageProcessor: the whole image resized to
  the model's size, bilinear); the AugReg and hybrid checkpoints' timm
  `pretrained_cfg` (timm 1.0.31: `crop_pct` 0.9 at 224 and 1.0 at 384,
  `crop_mode` "center", bicubic). Every source's client drops alpha.
- `license`, `params`: parameter count of the model `from_preset` builds
  (with the head when `num_classes` is set; the Hugging Face pooler of the
  ImageNet-21k checkpoints is not part of it).

The hybrid's ImageNet-21k checkpoint is registered without a head: timm
keeps a 21,843-class `head` in it but drops the representation (pre-logits)
layer the original head was trained on top of (and the original in21k
releases zeroed their heads), so only its features are usable.

The later members of the family (issue 48) are registered from timm's hub
copies, each the image tower only (image-text towers are out of scope): SigLIP
and SigLIP 2 (attention pooling, no class token: the pooled MAP embedding is
the feature), CLIP ViT-B/16 (pre-norm, quick-GELU), DINOv2 with registers at
S and B, and DeiT-B distilled (an ImageNet-1k classifier with its two heads).
Two more fields say what differs:

- `family`: `"vit"` (the paper's and AugReg's, the hybrid), `"siglip"`,
  `"siglip2"`, `"clip"`, `"dinov2"` or `"deit"`; the tests check each
  family's own facts (names, mean/std, hub names) per entry.
- `registry_decides` (optional): keys of `config` that the checkpoint's files
  do not record, given to its reader instead of inferred. OpenAI's CLIP was
  trained with quick-GELU, but timm's hub copy names the architecture
  `vit_base_patch16_clip_224`, whose MLP is exact GELU (timm's own note on
  the tag: "natively QuickGELU, use quickgelu model variant for original
  results"); the entry gives the reader `mlp_activation="quick_gelu"`. The
  So400m/14 entry gives it its crop (below).

Their preprocessing and evaluation transform are timm 1.0.31's
`pretrained_cfg` for the tag (`timm.models.get_pretrained_cfg`, read offline):
mean/std 0.5 for SigLIP, OpenAI's own mean/std for CLIP, ImageNet's for DINOv2
and DeiT; all bicubic with a centre crop of 0.9 (SigLIP at 384 too), except
DINOv2's 1.0 at 518. SigLIP So400m/14's 384 is not a multiple of its patch:
the source's patch convolution sees the top-left 378 pixels, so the entry's
model takes 378, cropped at timm's scale (`crop_fraction` 0.9 * 378 / 384)
and centred, 3 pixels off the source's window. Their `params` are timm's counts of the same
architecture built with random weights (`num_classes=0`, or DeiT's 1000). No
revision or checksum is pinned for them: the hub could not be read from where
they were registered, so a download is checked by size, format and parameter
count.
"""

_PAPER = "An Image is Worth 16x16 Words (Dosovitskiy et al., 2021)"
_AUGREG = "How to train your ViT (Steiner et al., 2021)"
_HF_CONFIG = {"layer_norm_epsilon": 1e-12}


# The evaluation transform of each source, as `ViTBackbone` arguments (see above).
_HF_TRANSFORM = {"resize_mode": "stretch", "crop_fraction": 1.0, "interpolation": "bilinear", "alpha": "drop"}


def _timm_transform(image_size):
    return {"resize_mode": "center_crop", "crop_fraction": 0.9 if image_size == 224 else 1.0,
            "interpolation": "bicubic", "alpha": "drop"}


def _entry(variant, image_size, num_classes, source, fmt, params, description, revision=None, sha256=None):
    return {
        "description": description,
        "family": "vit",
        "variant": variant,
        "image_size": image_size,
        "config": {**_HF_CONFIG, **_HF_TRANSFORM} if fmt == "huggingface" else _timm_transform(image_size),
        "num_classes": num_classes,
        "class_names": "imagenet-1k" if num_classes == 1000 else None,
        "pixel_mean": 0.5,
        "pixel_std": 0.5,
        "source": source,
        "format": fmt,
        "revision": revision,
        "sha256": sha256,
        "license": "apache-2.0",
        "params": params,
    }


def _original(variant, image_size, num_classes, repo, params, revision=None, sha256=None):
    what = "pre-trained on ImageNet-21k, no head" if num_classes is None else (
        f"ImageNet-21k pre-trained, fine-tuned on ImageNet-1k at {image_size}")
    return _entry(variant, image_size, num_classes, f"hf://google/{repo}", "huggingface", params,
                  f"{variant} {what}; original checkpoint of {_PAPER}.", revision, sha256)


def _augreg(variant, image_size, num_classes, timm_name, params, what):
    return _entry(variant, image_size, num_classes, f"hf://timm/{timm_name}", "timm", params,
                  f"{variant} {what}; AugReg checkpoint of {_AUGREG}.")


def _hybrid(variant, image_size, num_classes, timm_name, params, what):
    return _entry(variant, image_size, num_classes, f"hf://timm/{timm_name}", "timm", params,
                  f"{variant} hybrid {what}; original checkpoint of {_PAPER}.")


# timm 1.0.31's pretrained_cfg means and standard deviations (timm.data.constants).
_IMAGENET_MEAN, _IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
_CLIP_MEAN, _CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
_LATER = {  # family -> (paper or release, pixel mean, pixel std, architecture config beside the variant)
    "siglip": ("SigLIP (Zhai et al., 2023), WebLI", 0.5, 0.5,
               {"use_class_token": False, "attention_pooling": True}),
    "siglip2": ("SigLIP 2 (Tschannen et al., 2025), WebLI", 0.5, 0.5,
                {"use_class_token": False, "attention_pooling": True}),
    "clip": ("CLIP (Radford et al., 2021), OpenAI's weights", _CLIP_MEAN, _CLIP_STD,
             {"pre_norm": True, "mlp_activation": "quick_gelu", "layer_norm_epsilon": 1e-5}),
    "dinov2": ("DINOv2 with registers (Darcet et al., 2024), LVD-142M", _IMAGENET_MEAN, _IMAGENET_STD,
               {"num_register_tokens": 4, "prefix_position_embedding": False, "layer_scale_init": 1e-5}),
    "deit": ("DeiT (Touvron et al., 2021), distilled", _IMAGENET_MEAN, _IMAGENET_STD,
             {"use_distillation_token": True}),
}


def _later(family, variant, image_size, num_classes, timm_name, params, what, crop_fraction=0.9,
           license="apache-2.0", registry_decides=()):
    release, mean, std, architecture = _LATER[family]
    entry = {
        "description": f"{variant} {what}; {release}.",
        "family": family,
        "variant": variant,
        "image_size": image_size,
        "config": {**architecture, "resize_mode": "center_crop", "crop_fraction": crop_fraction,
                   "interpolation": "bicubic", "alpha": "drop"},
        "num_classes": num_classes,
        "class_names": "imagenet-1k" if num_classes == 1000 else None,
        "pixel_mean": mean,
        "pixel_std": std,
        "source": f"hf://timm/{timm_name}",
        "format": "timm",
        "revision": None,
        "sha256": None,
        "license": license,
        "params": params,
    }
    if registry_decides:
        entry["registry_decides"] = tuple(registry_decides)
    return entry


PRESETS = {
    # === Original checkpoints (google org, Hugging Face format) ===
    "vit_b16_in21k": _original("ViT-B/16", 224, None, "vit-base-patch16-224-in21k", 85_798_656),
    "vit_b32_in21k": _original("ViT-B/32", 224, None, "vit-base-patch32-224-in21k", 87_455_232),
    # The L and H ImageNet-21k safetensors files: revision and checksum as the hub shows them.
    "vit_l16_in21k": _original(
        "ViT-L/16", 224, None, "vit-large-patch16-224-in21k", 303_301_632,
        revision="6074eaf2211423e928c93b93ef773d5da618aa7e",
        sha256="bb92f203dc94f76fa1eb2cd9e19016ab0cd8fef300da5cd2bf350800ef2a91b9",
    ),
    # model.safetensors of this repo exists only on the (unmerged) conversion pull request.
    "vit_l32_in21k": _original(
        "ViT-L/32", 224, None, "vit-large-patch32-224-in21k", 305_510_400,
        revision="1170e42b7c584b04363ac5ad6b246001e8ba9113",
        sha256="305888200ef5f4be58ab84ce2295f94188e035d720fb2faea1b0418fee848225",
    ),
    "vit_h14_in21k": _original(
        "ViT-H/14", 224, None, "vit-huge-patch14-224-in21k", 630_764_800,
        sha256="2c72388bf7e6e31fbdec2bbbbfbedc24c648acf79705b18186c4e74bc1f24bab",
    ),
    "vit_b16_in21k_ft_in1k": _original("ViT-B/16", 224, 1000, "vit-base-patch16-224", 86_567_656),
    "vit_b16_in21k_ft_in1k_384": _original("ViT-B/16", 384, 1000, "vit-base-patch16-384", 86_859_496),
    "vit_b32_in21k_ft_in1k_384": _original("ViT-B/32", 384, 1000, "vit-base-patch32-384", 88_297_192),
    # model.safetensors of these three exists only on the hub's conversion pull requests.
    "vit_l16_in21k_ft_in1k": _original(
        "ViT-L/16", 224, 1000, "vit-large-patch16-224", 304_326_632,
        revision="8041a8c7b0517e25d4cfa63f2e2e35b50b853386",
        sha256="e145bac42eabd05431772b91c046920c901c2777817c5339d4e87aaaf2d6a3ce",
    ),
    "vit_l16_in21k_ft_in1k_384": _original(
        "ViT-L/16", 384, 1000, "vit-large-patch16-384", 304_715_752, revision="refs/pr/1",
    ),
    "vit_l32_in21k_ft_in1k_384": _original(
        "ViT-L/32", 384, 1000, "vit-large-patch32-384", 306_632_680,
        revision="7cb790d8aa73dc7882e7190b95f2dbde837abe21",
    ),
    # === AugReg: ImageNet-21k pre-training with its 21,843-class head (timm org) ===
    "vit_ti16_augreg_in21k": _augreg("ViT-Ti/16", 224, 21843, "vit_tiny_patch16_224.augreg_in21k", 9_740_115,
                                     "pre-trained on ImageNet-21k (21,843-class head)"),
    "vit_s32_augreg_in21k": _augreg("ViT-S/32", 224, 21843, "vit_small_patch32_224.augreg_in21k", 30_903_507,
                                    "pre-trained on ImageNet-21k (21,843-class head)"),
    "vit_s16_augreg_in21k": _augreg("ViT-S/16", 224, 21843, "vit_small_patch16_224.augreg_in21k", 30_075_219,
                                    "pre-trained on ImageNet-21k (21,843-class head)"),
    "vit_b32_augreg_in21k": _augreg("ViT-B/32", 224, 21843, "vit_base_patch32_224.augreg_in21k", 104_252_499,
                                    "pre-trained on ImageNet-21k (21,843-class head)"),
    "vit_b16_augreg_in21k": _augreg("ViT-B/16", 224, 21843, "vit_base_patch16_224.augreg_in21k", 102_595_923,
                                    "pre-trained on ImageNet-21k (21,843-class head)"),
    "vit_b8_augreg_in21k": _augreg("ViT-B/8", 224, 21843, "vit_base_patch8_224.augreg_in21k", 102_605_139,
                                   "pre-trained on ImageNet-21k (21,843-class head)"),
    "vit_l16_augreg_in21k": _augreg("ViT-L/16", 224, 21843, "vit_large_patch16_224.augreg_in21k", 325_690_707,
                                    "pre-trained on ImageNet-21k (21,843-class head)"),
    # === AugReg: ImageNet-21k pre-trained, fine-tuned on ImageNet-1k ===
    "vit_ti16_augreg_in21k_ft_in1k": _augreg(
        "ViT-Ti/16", 224, 1000, "vit_tiny_patch16_224.augreg_in21k_ft_in1k", 5_717_416,
        "ImageNet-21k pre-trained, fine-tuned on ImageNet-1k at 224"),
    "vit_ti16_augreg_in21k_ft_in1k_384": _augreg(
        "ViT-Ti/16", 384, 1000, "vit_tiny_patch16_384.augreg_in21k_ft_in1k", 5_790_376,
        "ImageNet-21k pre-trained, fine-tuned on ImageNet-1k at 384"),
    "vit_s32_augreg_in21k_ft_in1k": _augreg(
        "ViT-S/32", 224, 1000, "vit_small_patch32_224.augreg_in21k_ft_in1k", 22_878_952,
        "ImageNet-21k pre-trained, fine-tuned on ImageNet-1k at 224"),
    "vit_s32_augreg_in21k_ft_in1k_384": _augreg(
        "ViT-S/32", 384, 1000, "vit_small_patch32_384.augreg_in21k_ft_in1k", 22_915_432,
        "ImageNet-21k pre-trained, fine-tuned on ImageNet-1k at 384"),
    "vit_s16_augreg_in21k_ft_in1k": _augreg(
        "ViT-S/16", 224, 1000, "vit_small_patch16_224.augreg_in21k_ft_in1k", 22_050_664,
        "ImageNet-21k pre-trained, fine-tuned on ImageNet-1k at 224"),
    "vit_s16_augreg_in21k_ft_in1k_384": _augreg(
        "ViT-S/16", 384, 1000, "vit_small_patch16_384.augreg_in21k_ft_in1k", 22_196_584,
        "ImageNet-21k pre-trained, fine-tuned on ImageNet-1k at 384"),
    "vit_b32_augreg_in21k_ft_in1k": _augreg(
        "ViT-B/32", 224, 1000, "vit_base_patch32_224.augreg_in21k_ft_in1k", 88_224_232,
        "ImageNet-21k pre-trained, fine-tuned on ImageNet-1k at 224"),
    "vit_b32_augreg_in21k_ft_in1k_384": _augreg(
        "ViT-B/32", 384, 1000, "vit_base_patch32_384.augreg_in21k_ft_in1k", 88_297_192,
        "ImageNet-21k pre-trained, fine-tuned on ImageNet-1k at 384"),
    "vit_b16_augreg_in21k_ft_in1k": _augreg(
        "ViT-B/16", 224, 1000, "vit_base_patch16_224.augreg_in21k_ft_in1k", 86_567_656,
        "ImageNet-21k pre-trained, fine-tuned on ImageNet-1k at 224"),
    "vit_b16_augreg_in21k_ft_in1k_384": _augreg(
        "ViT-B/16", 384, 1000, "vit_base_patch16_384.augreg_in21k_ft_in1k", 86_859_496,
        "ImageNet-21k pre-trained, fine-tuned on ImageNet-1k at 384"),
    "vit_b8_augreg_in21k_ft_in1k": _augreg(
        "ViT-B/8", 224, 1000, "vit_base_patch8_224.augreg_in21k_ft_in1k", 86_576_872,
        "ImageNet-21k pre-trained, fine-tuned on ImageNet-1k at 224"),
    "vit_l16_augreg_in21k_ft_in1k": _augreg(
        "ViT-L/16", 224, 1000, "vit_large_patch16_224.augreg_in21k_ft_in1k", 304_326_632,
        "ImageNet-21k pre-trained, fine-tuned on ImageNet-1k at 224"),
    "vit_l16_augreg_in21k_ft_in1k_384": _augreg(
        "ViT-L/16", 384, 1000, "vit_large_patch16_384.augreg_in21k_ft_in1k", 304_715_752,
        "ImageNet-21k pre-trained, fine-tuned on ImageNet-1k at 384"),
    # Re-fine-tuned by timm's author from the same ImageNet-21k weights (timm tag augreg2).
    "vit_b16_augreg2_in21k_ft_in1k": _augreg(
        "ViT-B/16", 224, 1000, "vit_base_patch16_224.augreg2_in21k_ft_in1k", 86_567_656,
        "ImageNet-21k pre-trained, re-fine-tuned on ImageNet-1k at 224 (timm augreg2)"),
    "vit_b8_augreg2_in21k_ft_in1k": _augreg(
        "ViT-B/8", 224, 1000, "vit_base_patch8_224.augreg2_in21k_ft_in1k", 86_576_872,
        "ImageNet-21k pre-trained, re-fine-tuned on ImageNet-1k at 224 (timm augreg2)"),
    # === AugReg: trained on ImageNet-1k only ===
    "vit_s16_augreg_in1k": _augreg("ViT-S/16", 224, 1000, "vit_small_patch16_224.augreg_in1k", 22_050_664,
                                   "pre-trained and fine-tuned on ImageNet-1k only, at 224"),
    "vit_s16_augreg_in1k_384": _augreg("ViT-S/16", 384, 1000, "vit_small_patch16_384.augreg_in1k", 22_196_584,
                                       "pre-trained and fine-tuned on ImageNet-1k only, at 384"),
    "vit_b32_augreg_in1k": _augreg("ViT-B/32", 224, 1000, "vit_base_patch32_224.augreg_in1k", 88_224_232,
                                   "pre-trained and fine-tuned on ImageNet-1k only, at 224"),
    "vit_b32_augreg_in1k_384": _augreg("ViT-B/32", 384, 1000, "vit_base_patch32_384.augreg_in1k", 88_297_192,
                                       "pre-trained and fine-tuned on ImageNet-1k only, at 384"),
    "vit_b16_augreg_in1k": _augreg("ViT-B/16", 224, 1000, "vit_base_patch16_224.augreg_in1k", 86_567_656,
                                   "pre-trained and fine-tuned on ImageNet-1k only, at 224"),
    "vit_b16_augreg_in1k_384": _augreg("ViT-B/16", 384, 1000, "vit_base_patch16_384.augreg_in1k", 86_859_496,
                                       "pre-trained and fine-tuned on ImageNet-1k only, at 384"),
    # === Hybrid: the paper's R50+ViT-B/16 (timm format; Google's .npz ported by timm) ===
    # timm's default_cfgs: `vit_base_r50_s16_224.orig_in21k` (21,843-class head whose
    # pre-logits layer timm removed: unusable, so no head here) and
    # `vit_base_r50_s16_384.orig_in21k_ft_in1k`; both mean/std 0.5.
    "vit_r50_b16_in21k": _hybrid("R50+ViT-B/16", 224, None, "vit_base_r50_s16_224.orig_in21k", 97_890_112,
                                 "pre-trained on ImageNet-21k, no head"),
    "vit_r50_b16_in21k_ft_in1k_384": _hybrid(
        "R50+ViT-B/16", 384, 1000, "vit_base_r50_s16_384.orig_in21k_ft_in1k", 98_950_952,
        "ImageNet-21k pre-trained, fine-tuned on ImageNet-1k at 384"),
    # === Later members of the family, timm's hub copies: the image tower and its pooled feature ===
    "siglip_b16_webli": _later("siglip", "ViT-B/16", 224, None, "vit_base_patch16_siglip_224.webli", 92_884_224,
                               "SigLIP image tower, attention-pooled embedding, no head"),
    # 384 is not a multiple of 14: timm's (and big_vision's, and Hugging Face's) patch convolution sees
    # the top-left 378 x 378 pixels of the 384 crop and drops the last 6 rows and columns; keras_vit's
    # model takes those 378 (the converter builds it from the 27 x 27 position table). The crop keeps
    # timm's scale (0.9 of 384, so 0.9 * 378 / 384 of 378) and is centred: 3 pixels off timm's window.
    "siglip_so400m14_webli_384": _later(
        "siglip", "ViT-So400m/14", 378, None, "vit_so400m_patch14_siglip_384.webli", 428_225_600,
        "SigLIP image tower (timm's 384 crop, of which the patches see 378), attention-pooled embedding, no head",
        crop_fraction=0.9 * 378 / 384, registry_decides=("crop_fraction",)),
    "siglip2_b16_webli": _later("siglip2", "ViT-B/16", 224, None, "vit_base_patch16_siglip_224.v2_webli",
                                92_884_224, "SigLIP 2 image tower, attention-pooled embedding, no head"),
    # OpenAI's CLIP code and weights are released under the MIT license (github.com/openai/CLIP);
    # timm's hub card says apache-2.0, timm's default. Timm's `head` (the 512-wide projection into
    # the text space) is left out: the class token after the final norm is the image feature.
    "clip_b16_openai": _later("clip", "ViT-B/16", 224, None, "vit_base_patch16_clip_224.openai", 85_799_424,
                              "CLIP image tower, class-token feature before the projection, no head",
                              license="mit", registry_decides=("mlp_activation",)),
    "dinov2_s14_reg4_lvd142m": _later(
        "dinov2", "ViT-S/14", 518, None, "vit_small_patch14_reg4_dinov2.lvd142m", 22_057_344,
        "DINOv2 self-supervised backbone with 4 registers at 518, no head", crop_fraction=1.0),
    "dinov2_b14_reg4_lvd142m": _later(
        "dinov2", "ViT-B/14", 518, None, "vit_base_patch14_reg4_dinov2.lvd142m", 86_582_016,
        "DINOv2 self-supervised backbone with 4 registers at 518, no head", crop_fraction=1.0),
    "deit_b16_distilled_in1k": _later(
        "deit", "ViT-B/16", 224, 1000, "deit_base_distilled_patch16_224.fb_in1k", 87_338_192,
        "ImageNet-1k classifier with class and distillation heads (averaged at inference)"),
}
