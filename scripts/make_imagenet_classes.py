"""Write `imagenet_classes.txt` from the ImageNet info files that timm ships.

Run with the reference environment (timm is never a dependency of keras_vit):

    .venv-ref/bin/python scripts/make_imagenet_classes.py

Each output line is `<wordnet synset>\t<comma-separated WordNet lemmas>`, in
the class-index order of ImageNet-1k (timm's `imagenet_synsets.txt`), which
is the order of the 1000-class heads of the ViT checkpoints.
"""

import csv
import os
import pkgutil

import timm


def main():
    synsets = pkgutil.get_data("timm.data", "_info/imagenet_synsets.txt").decode("utf-8").split()
    rows = pkgutil.get_data("timm.data", "_info/imagenet_synset_to_lemma.txt").decode("utf-8").splitlines()
    lemmas = dict(csv.reader(rows, delimiter="\t"))
    assert len(synsets) == 1000 and len(set(synsets)) == 1000, len(synsets)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "keras_vit", "presets", "imagenet_classes.txt")
    with open(path, "w") as file:
        file.write(f"# ImageNet-1k classes in index order, from timm {timm.__version__} data/_info\n")
        for synset in synsets:
            file.write(f"{synset}\t{lemmas[synset]}\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
