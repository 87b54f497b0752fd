"""What the training commands (`train`, `pretrain`, `finetune`) share: `--distribute`, their checks, run settings.

Not a subcommand: the toolkit those three import. Like every command module,
it imports the library (and so Keras) only inside the functions that run
after parsing, so `keras-vit <command> --help` does not start a backend.
"""

import os
import sys
import warnings

from keras_vit.commands import UsageError
from keras_vit.commands.arguments import PositiveInt
from keras_vit.utils.errors import ArgumentError
from keras_vit.utils.files import check_not_nested, check_writable, output_format


def add_distribute_argument(parser):
    """Add `--distribute` and `--model-parallelism` to a training command's parser."""
    parser.add_argument(
        "--distribute", choices=("data", "model"), default=None,
        help="train on every device: 'data' copies the model to each (JAX keras.distribution; TensorFlow "
        "MirroredStrategy, TPUStrategy when TPU_NAME is set, MultiWorkerMirroredStrategy when TF_CONFIG names "
        "several workers; PyTorch: one process per device under torchrun, gradients averaged), 'model' also splits the weights over the devices of a host (JAX only). "
        "--batch-size is the global batch. Default: one device",
    )
    parser.add_argument(
        "--model-parallelism", action=PositiveInt, default=None, metavar="N",
        help="with --distribute model: the devices each weight is split over (the rest split the batch); it "
        "must divide the number of devices and the model's attention head count. Default: the devices of one host",
    )


def run_distributed(args, body):
    """`body(distribution)` inside `--distribute`'s distribution, or `body(None)` without the flag.

    In a job of several processes (torchrun, JAX's processes, TensorFlow
    workers named by TF_CONFIG), only process 0 prints: the others' standard
    output is discarded (errors still reach standard error).

    Raises:
        UsageError: `--model-parallelism` without `--distribute model`, or
            the backend or the launch cannot give that distribution.
    """
    model_parallelism = getattr(args, "model_parallelism", None)
    if model_parallelism is not None and getattr(args, "distribute", None) != "model":
        # Not ignored without a word: the user expects the weights split over devices.
        received = f"--distribute {args.distribute}" if getattr(args, "distribute", None) else "no --distribute"
        raise UsageError("--model-parallelism goes with --distribute model (it splits each weight over that many "
                         f"devices). Received: {received}")
    if not getattr(args, "distribute", None):
        return body(None)
    from keras_vit.distribution import distribution_for_backend, engines  # lazy: imports Keras (after parsing)

    try:
        distribution = distribution_for_backend(args.distribute, model_parallelism=model_parallelism,
                                                tpu=os.environ.get("TPU_NAME"))
    except (ValueError, RuntimeError) as error:
        raise UsageError(str(error)) from None
    if not engines.current().is_chief():  # process 0 reports for the job
        sys.stdout = open(os.devnull, "w")
        warnings.filterwarnings("ignore")
    with distribution.scope():
        return body(distribution)


def describe_distribution(distribution):
    """One line on the devices a distribution uses: its mesh, or its strategy and replicas."""
    mesh = getattr(distribution, "device_mesh", None)
    if mesh is not None:
        return f"mesh {dict(zip(mesh.axis_names, mesh.shape))}"
    return f"{type(distribution).__name__} with {distribution.num_replicas_in_sync} replicas"


def check_training_flags(args):
    """The checks `train` and `pretrain` make before any work: numbers, `--save`, the run directory.

    Each flag's own range is checked while parsing (`keras_vit.commands.arguments`); these are the library's
    checks again, and those that involve more than one flag or the file system.

    Raises:
        UsageError: `--init-from` with `--variant`.
        ArgumentError: a number out of range, a `--save` that is not a
            writable `.keras` path, a run directory holding files keras_vit
            did not write.
    """
    # lazy: the workflows import Keras (after parsing)
    from keras_vit.workflows.resuming import check_run_dir, default_run_dir
    from keras_vit.workflows.training import check_training_arguments

    if getattr(args, "init_from", None) and getattr(args, "variant", None) is not None:
        raise UsageError("--init-from takes its architecture from the file; drop --variant (or drop --init-from "
                         "to train the variant from scratch).")

    check_training_arguments(
        epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.learning_rate,
        weight_decay=getattr(args, "weight_decay", None),
    )
    save = getattr(args, "save", None)
    if save is not None:
        if output_format(save) != "keras":
            raise ArgumentError("{name} must name a .keras file.", "save", save)
        check_writable(save)
    run_dir = getattr(args, "run_dir", None) or default_run_dir(save)
    check_run_dir(run_dir)
    # Neither output may be, hold or lie inside what the run reads (under any name: a link, a bind mount).
    init_from = getattr(args, "init_from", None)
    reads = {"data directory": getattr(args, "data_dir", None),
             "pre-trained model": init_from if init_from and os.path.exists(init_from) else None}
    check_not_nested(save, reads, "save")
    check_not_nested(run_dir, reads, "run_dir")


def run_settings(args, *names):
    """The arguments that define a run, recorded with its checkpoint so another command is not resumed."""
    return {name: getattr(args, name, None) for name in names}
