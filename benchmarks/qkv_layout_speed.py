"""Speed of the two qkv column orders on one backend: timm's order vs grouped per head.

    KERAS_BACKEND=torch PYTHONPATH=. .venv/bin/python benchmarks/qkv_layout_speed.py
    KERAS_BACKEND=jax PYTHONPATH=. .venv/bin/python benchmarks/qkv_layout_speed.py --variant ViT-S/16 --rounds 5

keras_vit's fused qkv kernel groups its columns per head by default
(`qkv_layout="heads"`, so a model-parallel split hands each device whole
heads); models saved before keep timm's order (`"timm"`). Both compute the
same function; what changes is how the attention splits the projection into
queries, keys and values (a reshape to `(B, T, H, 3, Dh)` instead of
`(B, T, 3, H, Dh)`). This measures whether that costs time on one device:
the same variant is built in both orders with the same weights, and forward
passes (`predict_on_batch`) and training steps (`train_on_batch`, SGD) are
timed in alternating rounds, so load on the host affects both alike. It
prints images/s per order, the ratio heads / timm, and the host.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def build(variant, qkv_layout, image_size):
    import keras_vit

    return keras_vit.ViTClassifier.from_variant(variant, image_size=image_size, num_classes=1000,
                                                qkv_layout=qkv_layout)


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="ViT-S/16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--forward-batch", type=int, default=8)
    parser.add_argument("--train-batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds per order (default: 4)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per round (median; default: 3)")
    args = parser.parse_args()

    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    from keras_vit.distribution import head_aligned

    # The same function in both orders: head_aligned copies the weights with the qkv columns permuted.
    models = {"timm": build(args.variant, "timm", args.image_size)}
    models["heads"] = head_aligned(models["timm"])
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, (args.forward_batch, args.image_size, args.image_size, 3)).astype("float32")
    train_images = images[: args.train_batch]
    labels = rng.integers(0, 1000, args.train_batch)
    gap = float(np.max(np.abs(models["heads"].predict_on_batch(images) - models["timm"].predict_on_batch(images))))
    for model in models.values():
        model.compile(optimizer=keras.optimizers.SGD(1e-3), loss="sparse_categorical_crossentropy")
        model.train_on_batch(train_images, labels)  # compile / warm up

    forward = {layout: [] for layout in models}
    train = {layout: [] for layout in models}
    for _ in range(args.rounds):
        for layout, model in models.items():
            forward[layout].append(args.forward_batch / timed(lambda: model.predict_on_batch(images), args.repeats))
            train[layout].append(args.train_batch / timed(lambda: model.train_on_batch(train_images, labels),
                                                          args.repeats))

    host = common.host_info()
    print(f"{args.variant}, {keras.backend.backend()}, {host['cpu']}, {host['nproc']} logical CPUs, "
          f"load {common.load_average():.2f} at the end; outputs of the two orders differ by {gap:.1e}")
    print("| order | forward images/s | train step images/s |")
    print("|---|---|---|")
    for layout in models:
        print(f"| {layout} | {statistics.median(forward[layout]):.2f} | {statistics.median(train[layout]):.2f} |")
    ratio_forward = statistics.median(forward["heads"]) / statistics.median(forward["timm"])
    ratio_train = statistics.median(train["heads"]) / statistics.median(train["timm"])
    print(f"| heads / timm | {ratio_forward:.3f} | {ratio_train:.3f} |")


if __name__ == "__main__":
    main()
