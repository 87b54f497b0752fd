"""`keras-vit finetune DATA_DIR`: fine-tune a ViT on a class-per-subfolder image folder."""

from keras_vit.commands.arguments import (
    Fraction,
    ModelHandle,
    NonNegativeFloat,
    NonNegativeInt,
    Path,
    PositiveFloat,
    PositiveFraction,
    PositiveInt,
    Seed,
    Variant,
)
from keras_vit.commands import UsageError
from keras_vit.commands.training_options import add_distribute_argument, refuse_together, run_distributed


def add_arguments(parser):
    parser.add_argument("data_dir", action=Path, metavar="DATA_DIR", help="a folder with one subfolder of images per class")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--preset", action=ModelHandle,
        help="pre-trained weights: a preset name (see `keras-vit presets`), hf://org/repo, a preset directory, "
        "a converted checkpoint (.safetensors, .npz, Hugging Face directory) or a .keras file "
        "(e.g. from `keras-vit pretrain`)",
    )
    source.add_argument("--variant", action=Variant, help="train this variant (e.g. 'ViT-S/16') from scratch instead")
    parser.add_argument("--image-size", action=PositiveInt, default=None,
                        help="fine-tuning resolution; position embeddings are resampled (default: the model's)")
    parser.add_argument("--recipe", choices=("paper", "adamw"), default="paper",
                        help="paper: SGD momentum 0.9, no weight decay, clipping at global norm 1, cosine decay "
                        "with warm-up, batch 512 by gradient accumulation; adamw: AdamW, weight decay 0.05 "
                        "(default: paper)")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--steps", action=PositiveInt, default=None, metavar="UPDATES",
                        help="optimizer updates of the run, rounded up to whole epochs (default: 500, the paper's "
                        "count for its smallest fine-tuning sets, but at most 100 passes over the training images, 60 from "
                        "scratch under 64 images; "
                        "on a small folder each update holds at most a tenth of the images, in whole batches)")
    length.add_argument("--epochs", action=PositiveInt, default=None,
                        help="passes over the training images instead of --steps")
    parser.add_argument("--batch-size", action=PositiveInt, default=32, help="images per step (default: 32)")
    parser.add_argument("--effective-batch-size", action=NonNegativeInt, default=None,
                        help="images per update, by gradient accumulation in whole batches (default: the recipe's, "
                        "512 for paper; 0 turns accumulation off); an epoch leaves out its last few batches rather "
                        "than shrink the update")
    parser.add_argument("--learning-rate", action=PositiveFloat, default=None,
                        help="peak learning rate (default: the recipe's, 0.01 paper / 1e-3 adamw)")
    parser.add_argument("--weight-decay", action=NonNegativeFloat, default=None, help="default: the recipe's (0 / 0.05)")
    parser.add_argument("--validation-dir", action=Path, default=None,
                        help="held-out folder with the same class subfolders (default: a split of DATA_DIR)")
    parser.add_argument("--validation-split", action=Fraction, default=None,
                        help="share of each class held out when there is no --validation-dir (default: 0.2)")
    parser.add_argument("--randaugment", action="store_true", help="add Keras' RandAugment (2 ops)")
    parser.add_argument("--mixup", action=NonNegativeFloat, default=0.0, help="MixUp alpha; 0 is off (default: 0)")
    parser.add_argument("--cutmix", action=NonNegativeFloat, default=0.0, help="CutMix factor; 0 is off (default: 0)")
    parser.add_argument("--no-crop", action="store_true",
                        help="no random resized crop (resize and centre-crop training images too)")
    parser.add_argument("--crop-min-area", action=PositiveFraction, default=None, metavar="SHARE",
                        help="smallest share of the image area a random resized crop keeps, up to the whole image "
                        "(default: 0.05, the paper's inception crop)")
    parser.add_argument("--no-flip", action="store_true", help="no random horizontal flip")
    parser.add_argument("--skip-bad-files", action="store_true",
                        help="log and leave out unreadable, empty or oversized images instead of stopping")
    parser.add_argument("--output", action=Path, default=None,
                        help="write the fine-tuned model here as a preset with the class names "
                        "(`keras-vit predict IMAGE --preset OUTPUT`)")
    parser.add_argument("--run-dir", action=Path, default=None,
                        help="checkpoint every epoch here and resume when the same command runs again "
                        "(default: OUTPUT.run beside --output)")
    parser.add_argument("--patience", action=PositiveInt, default=None, metavar="EVALUATIONS",
                        help="with held-out images, stop when the held-out accuracy (ties: the loss) has not improved "
                        "for this many evaluations (one per epoch) and keep the best evaluation's weights "
                        "(default: 5)")
    parser.add_argument("--no-early-stop", action="store_true",
                        help="train every planned update and keep the last weights, not the best held-out "
                        "evaluation's")
    parser.add_argument("--seed", action=Seed, default=0, help="seed of the split, head and augmentation (default: 0)")
    parser.add_argument("--workers", action=PositiveInt, default=2, help="image-decoding threads (default: 2)")
    parser.add_argument("--lora", dest="lora_rank", action=PositiveInt, default=None, metavar="RANK",
                        help="train rank-RANK LoRA updates of every block's attention and MLP (and the head) instead "
                        "of every weight; the saved preset has them merged and loads without LoRA (default: off)")
    parser.add_argument("--remat", action="store_true",
                        help="recompute each block's activations in the backward pass: less memory for large "
                        "variants, one more forward pass per step (needs a model without dropout or drop path)")
    add_distribute_argument(parser)


def run(args):
    check_flags(args)
    return run_distributed(args, lambda distribution: _run(args))


def check_flags(args):
    """Refuse flags given together that contradict each other (exit 2), before any work."""
    refuse_together(args, "crop_min_area", "no_crop", "--no-crop turns the random resized crop off, --crop-min-area "
                    "sets its smallest share of the area")
    refuse_together(args, "patience", "no_early_stop", "--no-early-stop keeps the last weights and never stops "
                    "early, --patience sets when to stop early")
    refuse_together(args, "validation_split", "validation_dir", "--validation-dir holds the held-out images, so "
                    "none of DATA_DIR is split off")
    if args.effective_batch_size and args.effective_batch_size < args.batch_size:
        raise UsageError(f"--effective-batch-size {args.effective_batch_size} is smaller than --batch-size "
                         f"{args.batch_size}: an update holds at least one batch. Lower --batch-size, or give "
                         "--effective-batch-size 0 for one batch per update.")


def _run(args):
    # The library, and so Keras, is imported here, after parsing: `keras-vit finetune --help` starts no backend.
    from keras_vit.data import AugmentPolicy
    from keras_vit.workflows.finetuning import finetune

    # Every flag's value was checked while parsing (keras_vit/commands/arguments.py); the workflow checks the
    # folders and the output before any work.
    crop_scale = {} if args.crop_min_area is None else {"crop_scale": (args.crop_min_area, 1.0)}
    augment = AugmentPolicy(crop=not args.no_crop, flip=not args.no_flip, randaugment=args.randaugment,
                            mixup=args.mixup, cutmix=args.cutmix, **crop_scale)
    effective = "recipe" if args.effective_batch_size is None else (args.effective_batch_size or None)
    result = finetune(
        args.data_dir, preset=args.preset, variant=args.variant, image_size=args.image_size, recipe=args.recipe,
        epochs=args.epochs, steps=args.steps, batch_size=args.batch_size, learning_rate=args.learning_rate,
        weight_decay=args.weight_decay, effective_batch_size=effective, validation_dir=args.validation_dir,
        validation_split=0.2 if args.validation_split is None else args.validation_split, augment=augment, output=args.output,
        run_dir=args.run_dir or "auto", seed=args.seed, on_bad_file="skip" if args.skip_bad_files else "error",
        workers=args.workers, lora_rank=args.lora_rank, remat=args.remat, early_stop=not args.no_early_stop,
        **({} if args.patience is None else {"patience": args.patience}),
    )
    if result["accuracy"] is not None:
        chosen = ("; these images chose the weights kept, so the figure is optimistic" if result["best"] is not None
                  else "")
        print(f"Held-out accuracy: {result['accuracy']:.2%} (loss {result['loss']:.4f}; "
              f"trained in {result['seconds']:.0f} s{chosen})")
    if args.output:
        print(f"Saved the fine-tuned model with its {len(result['class_names'])} class names to {args.output}; "
              f"classify with `keras-vit predict IMAGE --preset {args.output}`. Epoch log: "
              f"{result['run_dir']}/log.csv")
    return 0
