"""`keras-vit presets`: list the pretrained presets."""

from keras_vit.commands import UsageError


def add_arguments(parser):
    parser.add_argument("--with-head", action="store_true", help="only presets with a classification head")
    parser.add_argument("--backbones", action="store_true", help="only headless (feature-extraction) presets")
    parser.add_argument("--verbose", "-v", action="store_true", help="also print source, revision and checksum")


def run(args):
    from keras_vit.presets.registry import PRESETS  # after parsing: the presets package imports Keras

    if args.with_head and args.backbones:
        raise UsageError("--with-head and --backbones exclude each other (together they list nothing); give one.")

    names = sorted(PRESETS)
    if args.with_head:
        names = [name for name in names if PRESETS[name]["num_classes"] is not None]
    if args.backbones:
        names = [name for name in names if PRESETS[name]["num_classes"] is None]
    width = max((len(name) for name in names), default=0)
    print(f"{'preset':<{width}}  {'params':>12}  {'size':>4}  {'classes':>7}  description")
    for name in names:
        entry = PRESETS[name]
        classes = entry["num_classes"] or "-"
        print(f"{name:<{width}}  {entry['params']:>12,}  {entry['image_size']:>4}  {classes:>7}  {entry['description']}")
        if args.verbose:
            print(f"{'':<{width}}  source {entry['source']} ({entry['format']}), revision "
                  f"{entry['revision'] or 'main'}, sha256 {entry['sha256'] or 'not pinned'}, license {entry['license']}")
    print(f"\n{len(names)} presets. Load one with keras_vit.ViTClassifier.from_preset(NAME); one without a head "
          "(classes '-') with keras_vit.ViTBackbone.from_preset(NAME), or ViTClassifier.from_preset(NAME, "
          "num_classes=N) for a new head.")
    return 0
