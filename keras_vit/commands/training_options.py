"""What the training commands (`train`, `pretrain`, `finetune`) share: `--distribute`, their checks, run settings.

Not a subcommand: the toolkit those three import. Like every command module,
it imports the library (and so Keras) only inside the functions that run
after parsing, so `keras-vit <command> --help` does not start a backend.
"""

import os
import sys
import warnings

from keras_vit.commands import UsageError
from keras_vit.commands.arguments import PositiveInt, output_format
from keras_vit.utils.errors import ArgumentError
from keras_vit.writer.files import FILE, claim


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

    A launch of several processes without `--distribute`, or one the
    backend's engine does not join, is refused first
    (`engines.check_launch`); once joined, the processes compare their
    flags (`command_fingerprint`) and stop, every one of them, when they
    differ (`Engine.agree`).

    Raises:
        UsageError: `--model-parallelism` without `--distribute model`, or
            the backend or the launch cannot give that distribution.
        JobError: a launcher's variables without `--distribute` (or for
            another backend), or processes whose flags differ.
    """
    model_parallelism = getattr(args, "model_parallelism", None)
    if model_parallelism is not None and getattr(args, "distribute", None) != "model":
        # Not ignored without a word: the user expects the weights split over devices.
        received = f"--distribute {args.distribute}" if getattr(args, "distribute", None) else "no --distribute"
        raise UsageError("--model-parallelism goes with --distribute model (it splits each weight over that many "
                         f"devices). Received: {received}")
    from keras_vit.distribution import distribution_for_backend, engines  # lazy: imports Keras (after parsing)

    # A launcher's variables without --distribute: every process would train alone on the same outputs.
    engines.check_launch(getattr(args, "distribute", None))
    if not getattr(args, "distribute", None):
        return body(None)
    try:
        distribution = distribution_for_backend(args.distribute, model_parallelism=model_parallelism,
                                                tpu=os.environ.get("TPU_NAME"))
    except (ValueError, RuntimeError) as error:
        raise UsageError(str(error)) from None
    # At the join, before any work: processes given different flags would compute different steps and
    # wait for each other at the first collective that differs (the data and the model are compared again
    # before training, `keras_vit.workflows.resuming.fit_resumable`).
    engines.current().agree(command_fingerprint(args))
    if not engines.current().is_chief():  # process 0 reports for the job
        sys.stdout = open(os.devnull, "w")
        warnings.filterwarnings("ignore")
    with distribution.scope():
        return body(distribution)


# Flags a job's processes may set differently: where each reads and writes (the data is compared by its
# listing and the model by its config before training: hosts may mount them at other paths), and threads. The
# run directory these lead to is compared apart (`agreement.run_directory`): every process resumes from it.
_NOT_COMPARED = ("data_dir", "validation_dir", "output", "save", "run_dir", "workers", "debug")
# Flags that name a model: a registry name is compared as it is, a local path by what it holds.
_MODEL_HANDLES = ("preset", "init_from")


def command_fingerprint(args):
    """What every process of a job must agree on before it starts: the command, its flags, the versions.

    `{"the command": ..., "--batch-size": 4, ..., "keras_vit version": ...}`:
    every parsed flag by the name the user typed, except those that name
    where a process reads or writes (`DATA_DIR`, `--validation-dir`,
    `--output`, `--save`, `--run-dir`: their contents are compared before
    training, as the data's listing) and `--workers` (decoding threads,
    which change no number); a `--preset` or `--init-from` that is a local
    path is compared by what it holds (a digest of its bytes), not its
    spelling; the run directory (`--run-dir`, else `OUTPUT.run`) by its
    resolved path, as each process's working directory resolves it: every
    process resumes from it. The paths are named in the line when they
    differ (`joining.WHERE`).
    """
    import keras

    from keras_vit import __version__
    from keras_vit.cli import build_parser
    from keras_vit.distribution.engines.joining import WHERE
    from keras_vit.workflows.agreement import model_handle, run_directory

    try:  # the flags as the user typed them (`lora_rank` is `--lora`)
        names = build_parser(args.command).flag_names
    except Exception:  # noqa: BLE001 - a namespace not from the command line: its own names
        names = {}
    fingerprint, where = {"the command": getattr(args, "command", None)}, {}
    for name, value in sorted(vars(args).items()):
        if name in _NOT_COMPARED or name == "command":
            continue
        flag = names.get(name, f"--{name.replace('_', '-')}")
        if name in _MODEL_HANDLES:
            value, where[flag] = model_handle(value)
        if not isinstance(value, (str, int, float, bool, type(None))):
            value = repr(value)
        fingerprint[flag] = value
    flag = names.get("run_dir", "--run-dir")
    fingerprint[flag] = where[flag] = run_directory(
        getattr(args, "run_dir", None), getattr(args, "save", None) or getattr(args, "output", None))
    fingerprint[WHERE] = {flag: path for flag, path in where.items() if path}
    fingerprint["keras_vit version"] = __version__
    fingerprint["Keras version"] = keras.__version__
    fingerprint["the backend"] = keras.backend.backend()
    return fingerprint


def describe_distribution(distribution):
    """One line on the devices a distribution uses: its mesh, or its strategy and replicas."""
    mesh = getattr(distribution, "device_mesh", None)
    if mesh is not None:
        return f"mesh {dict(zip(mesh.axis_names, mesh.shape))}"
    return f"{type(distribution).__name__} with {distribution.num_replicas_in_sync} replicas"


def check_training_flags(args):
    """The checks `train` and `pretrain` make before any work: numbers; then their run (claims `--save`, the run directory).

    Each flag's own range is checked while parsing (`keras_vit.commands.arguments`); these are the library's
    checks again, and those that involve more than one flag or the file system.

    Raises:
        UsageError: `--init-from` with `--variant`.
        ArgumentError: a number out of range, a `--save` that is not a
            writable `.keras` path, a run directory holding files keras_vit
            did not write, an output that is, holds or lies inside an input.

    Returns:
        The `keras_vit.workflows.resuming.Run` of the command: the claims
        of the `--save` file (first) and of the run directory (`--run-dir`,
        else `SAVE.run`; none without either), each made once, here; the
        training, the save and the end of the run are its methods.
    """
    # lazy: the workflows import Keras (after parsing)
    from keras_vit.workflows.resuming import open_run
    from keras_vit.workflows.training import check_training_arguments

    if getattr(args, "init_from", None) and getattr(args, "variant", None) is not None:
        raise UsageError("--init-from takes its architecture from the file; drop --variant (or drop --init-from "
                         "to train the variant from scratch).")

    check_training_arguments(
        epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.learning_rate,
        weight_decay=getattr(args, "weight_decay", None),
    )
    save = getattr(args, "save", None)
    if save is not None and output_format(save) != "keras":
        raise ArgumentError("{name} must name a .keras file.", "save", save)
    # Neither output may be, hold or lie inside what the run reads (under any name: a link, a bind mount).
    init_from = getattr(args, "init_from", None)
    reads = {"data directory": getattr(args, "data_dir", None),
             "pre-trained model": init_from if init_from and os.path.exists(init_from) else None}
    return open_run(save, getattr(args, "run_dir", None) or "auto", inputs=reads, output_kind=FILE,
                    output_argument="save")


def refuse_together(args, first, second, why):
    """Exit 2 when two flags that contradict each other are both given, rather than silently drop one.

    A flag is given when its value is neither `None` nor `False` (give the
    parser `default=None` for a flag whose default would count).

    Args:
        args: the parsed flags.
        first, second: str. The flags' destinations (`"crop_min_area"`).
        why: str. Why they cannot go together, for the message.

    Raises:
        UsageError: naming both flags and the values received.
    """
    values = [getattr(args, name, None) for name in (first, second)]
    if all(value is not None and value is not False for value in values):
        flags = [f"--{name.replace('_', '-')}" for name in (first, second)]
        shown = [flag if value is True else f"{flag} {value}" for flag, value in zip(flags, values)]
        raise UsageError(f"{flags[0]} and {flags[1]} contradict each other: {why}. Give one of them. "
                         f"Received: {' '.join(shown)}")


def run_settings(args, *names):
    """The arguments that define a run, recorded with its checkpoint so another command is not resumed."""
    return {name: getattr(args, name, None) for name in names}
