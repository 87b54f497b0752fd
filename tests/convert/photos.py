"""The photographs of issue 47 and the random timm ViT-S/16 they are classified with.

Framework-free (numpy, Pillow, scikit-image, scikit-learn, safetensors): the
tests, `benchmarks/same_photo.py` and `scripts/make_photo_fixtures.py` (which
runs timm in the side environment) import this one module, so the photo files
and the checkpoint timm classified are the very ones the tests read.

- `write_photos(directory)`: nine real photographs that ship inside
  scikit-image and scikit-learn, written as the files a user has (JPEG for
  photos, PNG where a copy is small, gray or transparent).
- `write_checkpoint(directory, config, recipe)`: the timm checkpoint of the
  fixture, as timm publishes it on the hub (`config.json` +
  `model.safetensors`), its weights drawn from numpy's seeded generator by
  `recipe` (names, shapes, seed), so no weights are committed.
- the clients, end to end on the files: `keras_vit_predict` (the command as
  a user runs it), `transformers_pipeline`, and `compare` (top-5 order and the
  largest probability difference); frameworks are imported when called.
"""

import contextlib
import functools
import hashlib
import io
import json
import os
import re

import numpy as np

# name -> file name; the order is the order of the fixture's rows.
PHOTO_FILES = {
    "astronaut": "astronaut.jpg",
    "chelsea": "chelsea.jpg",
    "chelsea_small": "chelsea_120x80.png",
    "coffee": "coffee.jpg",
    "coffee_rgba": "coffee_rgba.png",
    "rocket": "rocket.jpg",
    "camera": "camera_gray.png",
    "china": "china.jpg",
    "flower_strip": "flower_640x200.jpg",
}
JPEG_QUALITY = 92


def _sample_images():
    from sklearn.datasets import load_sample_images

    images = load_sample_images()
    return {os.path.basename(path).split(".")[0]: image for path, image in zip(images.filenames, images.images)}


def _transparent(rgb):
    """`rgb` with a real alpha channel: opaque in the middle, fading to 1/8 at the corners."""
    height, width = rgb.shape[:2]
    rows = (np.arange(height) - (height - 1) / 2) / (height / 2)
    columns = (np.arange(width) - (width - 1) / 2) / (width / 2)
    radius = np.sqrt(rows[:, None] ** 2 + columns[None, :] ** 2) / np.sqrt(2)  # 0 centre, 1 corner
    alpha = np.clip(np.rint(255 * (1 - 0.875 * radius ** 2)), 32, 255).astype(np.uint8)
    return np.concatenate([rgb, alpha[..., None]], axis=-1)


def photo_arrays():
    """name -> uint8 array (H, W, 3), (H, W, 4) or (H, W): the pixels each file is written from."""
    import skimage.data
    from PIL import Image

    samples = _sample_images()
    chelsea = skimage.data.chelsea()
    coffee = skimage.data.coffee()
    flower = samples["flower"]
    top = (flower.shape[0] - 200) // 2
    return {
        "astronaut": skimage.data.astronaut(),
        "chelsea": chelsea,
        # A small copy (120 x 80): the model enlarges it.
        "chelsea_small": np.asarray(Image.fromarray(chelsea).resize((120, 80), Image.Resampling.LANCZOS)),
        "coffee": coffee,
        "coffee_rgba": _transparent(coffee),
        "rocket": skimage.data.rocket(),
        "camera": skimage.data.camera(),  # one channel
        "china": samples["china"],
        "flower_strip": flower[top:top + 200],  # 640 x 200: a wide strip
    }


def write_photos(directory):
    """Write the nine photo files into `directory`; returns name -> path (in `PHOTO_FILES` order)."""
    from PIL import Image

    os.makedirs(directory, exist_ok=True)
    paths = {}
    for name, array in photo_arrays().items():
        path = os.path.join(directory, PHOTO_FILES[name])
        image = Image.fromarray(array)
        if path.endswith(".jpg"):
            image.save(path, quality=JPEG_QUALITY)
        else:
            image.save(path)
        paths[name] = path
    return {name: paths[name] for name in PHOTO_FILES}


def pixel_digest(path):
    """SHA-256 of a file's decoded pixels and mode: the same photo in both environments."""
    from PIL import Image

    with Image.open(path) as image:
        return hashlib.sha256(image.mode.encode() + np.asarray(image).tobytes()).hexdigest()


def random_weights(recipe):
    """The fixture's weights: `recipe["tensors"]` (name, shape) drawn in order from `recipe["seed"]`.

    Linear and convolution kernels have unit-variance outputs (1 / sqrt(fan-in)), LayerNorm
    scales are near 1 and biases small, so the class token's output depends on the image; the
    head is `recipe["head_scale"]` times that, so that probabilities differ visibly.
    """
    rng = np.random.default_rng(recipe["seed"])
    weights = {}
    for name, shape in recipe["tensors"]:
        noise = rng.standard_normal(shape)
        if name.endswith("bias"):
            value = 0.02 * noise
        elif "norm" in name:
            value = 1.0 + 0.1 * noise
        elif name in ("cls_token", "pos_embed"):
            value = recipe["token_scale"] * noise
        else:
            fan_in = int(np.prod(shape[1:]))
            value = noise / np.sqrt(fan_in) * (recipe["head_scale"] if name == "head.weight" else 1.0)
        weights[name] = np.ascontiguousarray(value, dtype=np.float32)
    return weights


def write_checkpoint(directory, config, recipe):
    """A timm hub checkpoint in `directory`: `config` as `config.json`, `recipe`'s weights."""
    from safetensors.numpy import save_file

    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as handle:
        json.dump(config, handle, indent=2)
    save_file(random_weights(recipe), os.path.join(directory, "model.safetensors"))
    return directory


# --- The clients, end to end on the files --------------------------------------------------------


def keras_vit_predict(handle, paths):
    """`keras-vit predict` as a user runs it: photo path -> [(class id, name, probability)] for every class."""
    from keras_vit import cli

    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        code = cli.main(["predict", *paths, "--preset", str(handle), "--top", "100000"])
    if code != 0:
        raise RuntimeError(f"keras-vit predict failed ({code}): {output.getvalue()[-2000:]}")
    results, current = {}, None
    for line in output.getvalue().splitlines():
        if not line.startswith(" ") and line.endswith(":"):
            current = results.setdefault(line[:-1], [])
            continue
        match = re.fullmatch(r"\s+\d+\. (.*): ([0-9.]+)", line)
        if match is None or current is None:
            continue
        label, score = match.groups()
        # "tench (n01440764)" for ImageNet, "tabby cat (0)" for named classes, "class 3" for unnamed ones.
        named = re.fullmatch(r"(.*) \(([0-9a-z]+)\)", label)
        printed_id, name = (named.group(2), named.group(1)) if named else (label.split()[-1], label)
        class_id = int(printed_id) if printed_id.isdigit() else imagenet_index()[printed_id]
        current.append((class_id, name, float(score)))
    return [results[str(path)] for path in paths]


@functools.lru_cache(maxsize=1)
def imagenet_index():
    """WordNet synset -> ImageNet-1k class index (timm's class list, which keras_vit ships)."""
    from keras_vit.presets.imagenet import imagenet_classes

    return {synset: index for index, (synset, _) in enumerate(imagenet_classes())}


def as_probabilities(ranked, num_classes):
    probabilities = np.zeros(num_classes)
    for class_id, _, score in ranked:
        probabilities[class_id] = score
    return probabilities


def transformers_pipeline(directory, paths):
    """transformers' `pipeline("image-classification")` on the files: per photo [(label, probability)]."""
    import transformers

    classify = transformers.pipeline("image-classification", model=directory, device="cpu")
    num_classes = classify.model.config.num_labels
    return [[(item["label"], item["score"]) for item in classify(path, top_k=num_classes)] for path in paths]


def scores_by_class(ranked, id2label, reference):
    """The pipeline's (label, score) list as a vector by class index.

    A few ImageNet classes share a first name ("crane", "maillot"): their scores go to their
    classes in the reference's order, the assignment most favourable to the client.
    """
    classes_of = {}
    for class_id, label in sorted(id2label.items()):
        classes_of.setdefault(label, []).append(class_id)
    scores_of = {}
    for label, score in ranked:
        scores_of.setdefault(label, []).append(score)
    client = np.zeros_like(reference)
    for label, scores in scores_of.items():
        classes = sorted(classes_of[label], key=lambda class_id: -reference[class_id])
        client[classes] = sorted(scores, reverse=True)
    return client


def compare(client, reference, top=5):
    """(same top-`top` in the same order, largest probability difference) of two probability vectors."""
    client_top = [int(i) for i in np.argsort(-client)[:top]]
    reference_top = [int(i) for i in np.argsort(-reference)[:top]]
    return client_top == reference_top, float(np.abs(client - reference).max())


# The class names of the transformers ViT saved in the tests (its id2label).
HF_CLASS_NAMES = ["tabby cat", "golden retriever", "space shuttle", "espresso", "teapot", "daisy", "pagoda",
                  "astronaut", "camera", "rose", "volcano", "lighthouse"]


def random_transformers_vit(seed):
    """A small transformers ViT at 224 px, patch 16, its weights drawn so that the answer depends on the photo."""
    import torch
    import transformers

    config = transformers.ViTConfig(
        image_size=224, patch_size=16, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=96, num_labels=len(HF_CLASS_NAMES), layer_norm_eps=1e-12,
        id2label=dict(enumerate(HF_CLASS_NAMES)), label2id={name: i for i, name in enumerate(HF_CLASS_NAMES)})
    model = transformers.ViTForImageClassification(config).eval()
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = rng.standard_normal(tuple(parameter.shape))
            if name.endswith("bias"):
                value = 0.02 * noise
            elif "layernorm" in name:
                value = 1.0 + 0.1 * noise
            elif name.endswith(("cls_token", "position_embeddings")):
                value = 0.1 * noise
            else:  # unit-variance outputs; the head 4 times that, so that probabilities differ visibly
                value = noise / np.sqrt(np.prod(parameter.shape[1:])) * (4.0 if name.startswith("classifier") else 1)
            parameter.copy_(torch.from_numpy(value.astype(np.float32)))
    return model
