"""Time timm's or Hugging Face's ViT (forward and training step) on CPU torch.

Runs in the reference environment (`.venv-ref`, which has timm); prints one
`BENCH_RESULT {json}` line. Models are built from their configs with random
weights (no download). The training step is the usual hand-written loop:
zero_grad, forward, cross-entropy, backward, AdamW step.

    .venv-ref/bin/python benchmarks/reference_worker.py --impl timm --variant ViT-S/16
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402


def build(impl, variant):
    cfg = common.SIZES[common.size_of(variant)]
    if impl == "timm":
        import timm

        return timm.create_model(common.TIMM_NAMES[variant], pretrained=False,
                                 num_classes=common.NUM_CLASSES)
    if common.is_hybrid(variant):
        raise SystemExit(f"hf: no {variant}: transformers 5 removed ViTHybrid; timm is the reference.")
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        hidden_size=cfg["hidden_dim"],
        num_hidden_layers=cfg["num_layers"],
        num_attention_heads=cfg["num_heads"],
        intermediate_size=cfg["mlp_dim"],
        image_size=common.IMAGE_SIZE,
        patch_size=common.PATCH_SIZE,
        num_labels=common.NUM_CLASSES,
        layer_norm_eps=1e-6,
        attn_implementation="sdpa",
    )
    # ViTForImageClassification is ViTModel plus a linear head on the class token.
    return ViTForImageClassification(config)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    common.add_common_arguments(parser)
    parser.add_argument("--impl", choices=("timm", "hf"), required=True)
    parser.add_argument("--autocast-bfloat16", action="store_true",
                        help="run forward and loss under torch.autocast('cpu', bfloat16), as AMP users do")
    parser.add_argument("--torch-compile", action="store_true",
                        help="wrap the model in torch.compile (default mode), as timm's train and "
                             "benchmark scripts do with --torchcompile; the first call includes compiling")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    import torch

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    if args.device == "gpu" and not torch.cuda.is_available():
        raise SystemExit(f"--device gpu: no accelerator for {args.impl} (torch {torch.__version__}: "
                         "torch.cuda.is_available() is False). Run on a machine with a GPU, or use --device cpu.")
    device = "cuda" if args.device == "gpu" else "cpu"
    # Timed calls end when the device is done, not when the kernels are queued.
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    import_seconds = time.perf_counter() - start
    rss_after_import = common.current_rss_mib()

    torch.manual_seed(0)
    model = build(args.impl, args.variant).to(device)
    # The module keeps its parameters; only its calls go through dynamo.
    runner = torch.compile(model) if args.torch_compile else model
    if args.impl == "hf":
        import transformers

        version = transformers.__version__
        call = lambda x: runner(pixel_values=x).logits  # noqa: E731
    else:
        import timm

        version = timm.__version__
        call = runner

    def autocast():
        return torch.autocast(device, dtype=torch.bfloat16, enabled=args.autocast_bfloat16)

    result = {
        "framework": args.impl + ("[compiled]" if args.torch_compile else ""),
        "torch_compile": args.torch_compile,
        "autocast_bfloat16": args.autocast_bfloat16,
        "variant": args.variant,
        "threads": args.threads,
        "version": version,
        "torch_version": torch.__version__,
        "num_params": sum(p.numel() for p in model.parameters()),
        "import_seconds": import_seconds,
        "rss_after_import_mib": rss_after_import,
        "load_before": common.load_average(),
    }

    if not args.skip_forward:
        model.eval()
        images = torch.randn(args.forward_batch, 3, common.IMAGE_SIZE, common.IMAGE_SIZE, device=device)

        def forward():
            with torch.inference_mode(), autocast():
                call(images)
            sync()

        result["forward_first_call_seconds"], result["forward"] = common.measure(forward, args.forward_batch, args)

    if not args.skip_train:
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        loss_fn = torch.nn.CrossEntropyLoss()
        images = torch.randn(args.train_batch, 3, common.IMAGE_SIZE, common.IMAGE_SIZE, device=device)
        labels = torch.randint(0, common.NUM_CLASSES, (args.train_batch,), device=device)

        def train_step():
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                loss = loss_fn(call(images), labels)
            loss.backward()
            optimizer.step()
            return loss.item()

        result["train_first_call_seconds"], result["train"] = common.measure(train_step, args.train_batch, args)

    result["peak_rss_mib"] = common.peak_rss_mib()
    result["device"] = args.device
    if device == "cuda":
        result["device_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    result["placement"] = {**common.placement(), "torch_threads": torch.get_num_threads()}
    result["load_after"] = common.load_average()
    common.emit(result)


if __name__ == "__main__":
    main()
