"""float32 vs int8 (keras_vit.quantize_model): accuracy or output difference, file size, peak memory, images/s.

    KERAS_BACKEND=jax PYTHONPATH=. .venv/bin/python benchmarks/quantize.py
    KERAS_BACKEND=jax PYTHONPATH=. .venv/bin/python benchmarks/quantize.py --models digits --epochs 30

Two models: the digits demo's ViT (`build_digits_classifier`, trained here
for `--epochs` on the 80% split, scored on the held-out 20%), and a ViT-S/16
at 224x224 with random weights from its variant (no committed timm fixture
has S/16's shapes; a random model measures size, memory and speed, and the
int8 outputs are compared with the float ones). Each (model, precision) is
measured in its own process, so the peak resident memory is that of serving
the saved model: one process saves the float model, another quantizes and
saves the int8 one, and each worker loads one saved `.keras` (its file size
is reported), predicts (accuracy / difference) and times `predict_on_batch`. Prints one Markdown table row per measurement and
the host.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import common  # noqa: E402


def prepare(name, directory, epochs):
    """Save the float model and its evaluation images (and labels / float outputs)."""
    import keras
    import numpy as np

    from keras_vit.data.digits import load_digits_split
    from keras_vit.workflows.digits_demo import build_digits_classifier
    from keras_vit.workflows.training import save_model

    if name == "digits":
        (x_train, y_train), (x_test, y_test) = load_digits_split()
        model = build_digits_classifier()
        model.compile(optimizer=keras.optimizers.AdamW(1e-3), loss="sparse_categorical_crossentropy")
        model.fit(x_train, y_train, epochs=epochs, batch_size=64, verbose=0)
        np.savez(os.path.join(directory, f"{name}.npz"), images=x_test, labels=y_test)
    else:
        import keras_vit

        keras.utils.set_random_seed(0)
        # Logits (no softmax), so the int8 difference is read on values of a usable scale.
        model = keras_vit.ViTClassifier.from_variant("ViT-S/16", num_classes=1000, activation=None)
        head = model.get_layer("head")  # zero-initialised: random, so the outputs depend on the weights
        head.kernel.assign(np.random.default_rng(0).normal(0, 0.02, head.kernel.shape).astype("float32"))
        images = np.random.default_rng(1).uniform(0, 255, (16, 224, 224, 3)).astype("float32")
        np.savez(os.path.join(directory, f"{name}.npz"), images=images)
    save_model(model, os.path.join(directory, f"{name}-float32.keras"))


def quantize(name, directory):
    """Load the float model, quantize it and save the int8 `.keras` the int8 worker loads."""
    import keras

    import keras_vit  # noqa: F401 - registers the models for load_model
    from keras_vit.workflows.quantization import quantize_model
    from keras_vit.workflows.training import save_model

    model = quantize_model(keras.saving.load_model(os.path.join(directory, f"{name}-float32.keras")))
    save_model(model, os.path.join(directory, f"{name}-int8.keras"))


def worker(name, precision, directory, batch, repeats):
    """Load the saved model of this precision (what serving it costs) and measure it."""
    import keras
    import numpy as np

    import keras_vit  # noqa: F401 - registers the models for load_model

    path = os.path.join(directory, f"{name}-{precision}.keras")
    model = keras.saving.load_model(path)
    data = np.load(os.path.join(directory, f"{name}.npz"))
    outputs = np.asarray(model.predict(data["images"], batch_size=batch, verbose=0))
    np.save(os.path.join(directory, f"{name}-{precision}-outputs.npy"), outputs)
    result = {"model": name, "precision": precision, "file_mib": os.path.getsize(path) / 2**20}
    if "labels" in data:
        result["accuracy"] = float(np.mean(outputs.argmax(-1) == data["labels"]))
    images = data["images"][:batch]
    timed = common.time_calls(lambda: model.predict_on_batch(images), warmup=2, repeats=repeats)
    result.update(images_per_s=common.summarize(timed, len(images))["images_per_s"], peak_rss_mib=common.peak_rss_mib())
    common.emit(result)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="digits,vit_s16")
    parser.add_argument("--epochs", type=int, default=30, help="digits training epochs (default: 30)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--worker", nargs=3, metavar=("MODEL", "PRECISION", "DIR"), help=argparse.SUPPRESS)
    parser.add_argument("--prepare", nargs=2, metavar=("MODEL", "DIR"), help=argparse.SUPPRESS)
    parser.add_argument("--quantize", nargs=2, metavar=("MODEL", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    batches = {"digits": 256, "vit_s16": 8}
    if args.prepare:
        return prepare(*args.prepare, args.epochs)
    if args.quantize:
        return quantize(*args.quantize)
    if args.worker:
        name, precision, directory = args.worker
        return worker(name, precision, directory, batches[name], args.repeats)
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    host = common.host_info()
    print(f"# {time.strftime('%Y-%m-%d', time.gmtime())}, KERAS_BACKEND={backend}, {host['nproc']} cores, "
          f"{host['cpu']}, load {common.load_average()}")
    print("| model | backend | precision | held-out accuracy, or max abs(int8 - float32) | file MiB | peak RSS MiB | images/s |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as directory:
        for name in args.models.split(","):
            # The float model is made in a child too: the driver never imports a backend.
            subprocess.run([sys.executable, __file__, "--epochs", str(args.epochs), "--prepare", name, directory],
                           check=True)
            subprocess.run([sys.executable, __file__, "--quantize", name, directory], check=True)
            for precision in ("float32", "int8"):
                out = subprocess.run([sys.executable, __file__, "--repeats", str(args.repeats), "--worker", name,
                                      precision, directory], check=True, capture_output=True, text=True).stdout
                result = json.loads(next(line for line in out.splitlines()
                                         if line.startswith("BENCH_RESULT "))[len("BENCH_RESULT "):])
                if "accuracy" in result:
                    quality = f"{result['accuracy']:.4f}"
                else:
                    import numpy as np

                    reference = np.load(os.path.join(directory, f"{name}-float32-outputs.npy"))
                    got = np.load(os.path.join(directory, f"{name}-{precision}-outputs.npy"))
                    quality = f"{np.max(np.abs(got - reference)):.2e} (outputs up to {np.max(np.abs(reference)):.2f})"
                print(f"| {name} | {backend} | {precision} | {quality} | {result['file_mib']:.2f} | "
                      f"{result['peak_rss_mib']:.0f} | {result['images_per_s']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
