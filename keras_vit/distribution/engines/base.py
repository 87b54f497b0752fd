"""What every engine of a job does, and what one process does: the interface the workflows call.

A job is one or many processes that train one model together. The
workflows (`keras_vit.workflows`) ask the job's engine, never a backend:

- `process_index()`, `process_count()`, `is_chief()`: which process this is
  (process 0, the chief, prints and writes for the job);
- `barrier()`, `broadcast_json(value)`, `gather_json(value)`: wait for every
  process; process 0's JSON value on every process; every process's on each;
- `agree(fingerprint)`: stop the job, on every process, when its processes
  would not train one model (a flag, the data or the model differs);
- `shard(dataset)`: this process's rows of every global batch (a copy; the
  caller's dataset is left as it is);
- `held_out(dataset)`: what this process evaluates of a held-out set;
- `fit_input(dataset)`: what `fit` and `evaluate` take for a dataset;
- `prepare(model)`: what a compiled model needs before `fit` (returns the
  callbacks to put first);
- `scope()`: the context to build, compile and fit in;
- `evaluate(model, dataset)`: the job's numbers on a whole held-out set;
- `restore(checkpoint, model)`: the epochs a run directory's backup holds;
- `save_for_job(write, destination)`: who writes in a job, the one place
  that decides it (process 0's file is kept; where saving is collective the
  others write a twin of the claim that is deleted).

This class is the job of one process; each engine of several processes
overrides what differs (`engines/jax_processes.py`, `torch_processes.py`,
`tf_workers.py`).
"""

import contextlib
import copy

from keras_vit.distribution.engines import joining


class Engine:
    """The job of one process: process 0 of 1, every dataset whole, `fit` and `evaluate` as Keras has them."""

    name = "one process"

    def process_index(self):
        """This process's index in the job, `0 <= index < process_count()`."""
        return 0

    def process_count(self):
        """The number of processes in the job."""
        return 1

    def is_chief(self):
        """True on process 0: the one that prints progress and writes files."""
        return self.process_index() == 0

    def barrier(self, name="keras_vit"):
        """Wait until every process of the job reaches this point."""

    def broadcast_json(self, value):
        """Process 0's `value` (any JSON value) on every process (sent as UTF-8 JSON, never pickled)."""
        return value

    def gather_json(self, value):
        """Every process's `value` (any JSON value), in process order, on every process (UTF-8 JSON, never pickled)."""
        return [value]

    def agree(self, fingerprint):
        """Stop, on every process, when the processes of the job differ in `fingerprint`.

        `fingerprint` is a JSON dict of what changes the arithmetic of
        training (the flags by name, the data's listing, the model's config,
        the version). Processes that differ would compute different steps,
        and the collectives that join their steps would wait for each other
        forever (a 2-process JAX job with `--batch-size 4` on one process and
        `8` on the other hung at step 2). Every process gathers every
        fingerprint, so every process finds the same difference and stops
        with the same line; none is left waiting for a partner.

        Raises:
            JobError: the first process that differs from process 0, with
                the first difference, both values and the fix.
        """
        if self.process_count() == 1:
            return
        message = joining.disagreement(self.gather_json(fingerprint))
        if message:
            raise joining.JobError(message)

    # === Data ===

    def batch_multiple(self):
        """Every batch is cut to a multiple of this many rows (the devices a JAX mesh splits a batch over)."""
        return 1

    def shard(self, dataset):
        """`dataset` as this process reads it: its rows of every global batch, cut to `batch_multiple()`.

        `ImageFolderDataset` and `ArrayBatches` (`keras_vit.data`) take a
        `shard=(index, count)`: each process reads only its rows of every
        batch (no image twice per step, none skipped in an epoch). The
        result is a copy; `dataset` itself is not changed. Any other type
        of data is returned as it is when one process reads it all.

        Raises:
            ValueError: several processes and data that cannot be shared
                out, or a batch size that `batch_multiple()` does not divide.
        """
        multiple, count = self.batch_multiple(), self.process_count()
        if multiple == 1 and count == 1 or not hasattr(dataset, "batch_multiple"):
            if count > 1:
                raise ValueError(
                    f"{count} processes need data that each process reads a share of: an ImageFolderDataset or "
                    f"ArrayBatches (keras_vit.data), which take `shard=(index, count)`. "
                    f"Received: {type(dataset).__name__}")
            return dataset
        if dataset.batch_size % multiple:
            raise ValueError(
                f"The batch size must be divisible by the {multiple} devices of the mesh's batch axis: JAX splits "
                f"every batch evenly over them. Received: batch_size={dataset.batch_size}")
        share = copy.copy(dataset)
        share.batch_multiple = multiple
        share.shard = (self.process_index(), count) if count > 1 else None
        return share

    def held_out(self, dataset):
        """What this process evaluates of a held-out `dataset` (for `fit`'s validation and `evaluate`)."""
        return None if dataset is None else self.shard(dataset)

    def fit_input(self, dataset):
        """What `fit` and `evaluate` take for `dataset` (a result of `shard` or `held_out`)."""
        return dataset

    # === The model ===

    def scope(self):
        """The context to build, compile and fit the model in."""
        return contextlib.nullcontext()

    def prepare(self, model, train=None):
        """Make a compiled `model` ready to `fit` on `train` (from `shard`); return the callbacks to put first."""
        return []

    def evaluate(self, model, dataset):
        """The job's loss and metrics (a dict) of `model` on the whole held-out `dataset`, weighted by its rows.

        `dataset` is the caller's, whole: each engine shares it out itself.
        """
        return model.evaluate(self.fit_input(self.held_out(dataset)), verbose=0, return_dict=True)

    # === Files ===

    def restore(self, checkpoint, model):
        """`checkpoint.restore(model)` for the job: the epochs its backup holds (0 without one)."""
        return checkpoint.restore(model)

    def saving_is_collective(self):
        """True when every process takes part in each save (only process 0's file is kept)."""
        return False

    def save_for_job(self, write, destination):
        """Run `write(claim)` as the job saves the claimed `destination`; True on the process whose file is kept.

        Process 0 writes through `destination` itself. Where saving is
        collective (`saving_is_collective()`), every other process writes
        the same through its twin in a scratch directory, deleted at once
        (`destination.discarded_copy()`); elsewhere the others write
        nothing. The caller writes through whichever claim it is given.
        """
        if self.is_chief():
            write(destination)
            return True
        if self.saving_is_collective():
            with destination.discarded_copy() as copy:
                write(copy)
        return False
