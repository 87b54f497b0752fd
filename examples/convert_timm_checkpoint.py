"""Convert a timm ViT checkpoint file into a keras_vit model, classify an image with it, save it as a preset.

A timm checkpoint here is a safetensors state dict (`model.safetensors`, alone
or in a hub directory beside timm's `config.json`). `keras_vit.convert.
load_checkpoint` reads it with numpy only (no pickles), infers the
architecture from the tensors' names and shapes, maps every weight exactly
once and carries the checkpoint's pixel preprocessing, so the model takes raw
[0, 255] pixels. The saved preset loads with `ViTClassifier.from_preset` on
any backend, with no timm installed.

Run from the repository root on any backend:

    KERAS_BACKEND=jax PYTHONPATH=. python examples/convert_timm_checkpoint.py vit_small.safetensors --image cat.jpg --output my_vit

To get such a file, in an environment with timm (not keras_vit's):

    import timm, safetensors.torch
    model = timm.create_model("vit_small_patch16_224.augreg_in21k_ft_in1k", pretrained=True)
    safetensors.torch.save_file(model.state_dict(), "vit_small.safetensors")

A `.pth` / `.bin` pickle is refused with the line that converts it.
"""

import argparse
import os
import tempfile

os.environ.setdefault("KERAS_BACKEND", "jax")

import numpy as np  # noqa: E402

import keras_vit  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a timm state dict (.safetensors) or a timm hub directory")
    parser.add_argument("--image", help="an image file to classify (default: a made-up one)")
    parser.add_argument("--image-size", type=int, help="build the model for this size (the position embedding "
                                                        "is resampled); defaults to the checkpoint's")
    parser.add_argument("--top", type=int, default=3, help="classes to print")
    parser.add_argument("--output", help="directory for the preset (default: a temporary one)")
    args = parser.parse_args(argv)

    model = keras_vit.convert.load_checkpoint(args.checkpoint, image_size=args.image_size)
    backbone = model.backbone
    patch = "x".join(map(str, backbone.patch_size))
    print(f"1/3 Read {args.checkpoint}: {type(model).__name__}, {backbone.num_layers} blocks of width "
          f"{backbone.hidden_dim}, patch {patch}, {model.input_shape[1]}x{model.input_shape[2]} "
          f"pixels, {model.num_classes} classes, {model.count_params():,} parameters.", flush=True)

    if args.image:  # the model's own evaluation transform (resize, crop, interpolation): the source's
        pixels = keras_vit.data.load_image(args.image, model)
        what = args.image
    else:
        height, width, channels = model.input_shape[1:]
        pixels = np.random.default_rng(0).integers(0, 256, (height, width, channels)).astype("float32")
        what = "a made-up image"
    probabilities = np.asarray(model.predict(pixels[None], verbose=0))[0]
    names = model.class_names or [f"class {index}" for index in range(len(probabilities))]
    ranked = ", ".join(f"{names[index]} {probabilities[index]:.1%}" for index in np.argsort(-probabilities)[:args.top])
    print(f"2/3 On {what}: {ranked}.", flush=True)

    with tempfile.TemporaryDirectory() as scratch:
        output = args.output or os.path.join(scratch, "converted")
        model.save_to_preset(output)
        reloaded = keras_vit.ViTClassifier.from_preset(output)
        again = np.asarray(reloaded.predict(pixels[None], verbose=0))[0]
        print(f"3/3 Saved to {output}; read back, the largest probability difference is "
              f"{np.max(np.abs(again - probabilities)):.1e}.", flush=True)


if __name__ == "__main__":
    main()
