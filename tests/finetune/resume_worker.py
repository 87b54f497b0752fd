"""A fine-tuning run for the kill / resume test: `python resume_worker.py DATA PRESET OUTPUT EPOCHS HELD_OUT`.

`SLOW_EPOCHS=seconds` pauses after each epoch so the test can kill the process mid-training. The last epoch's
weights (before the best evaluation's are put back) go to `OUTPUT.last.npz`. Only the run the test kills needs
a process of its own: the test runs the uninterrupted reference and the resumed run in its own process through
`run` (Keras starts once instead of three times).
"""

import os
import sys
import time

import keras
import numpy as np

import keras_vit


class Pause(keras.callbacks.Callback):
    def __init__(self, output):
        super().__init__()
        self.output = output

    def on_epoch_end(self, epoch, logs=None):
        print(f"epoch {epoch + 1} done", flush=True)
        time.sleep(float(os.environ.get("SLOW_EPOCHS", "0")))

    def on_train_end(self, logs=None):
        np.savez(self.output + ".last.npz", *[np.asarray(weight) for weight in self.model.get_weights()])


def run(data, preset, output, epochs, held_out):
    """The run; returns the line the test reads: `initial_epoch I epochs_run N best_epoch B`."""
    result = keras_vit.finetune(data, preset=preset, epochs=int(epochs), batch_size=8, recipe="adamw",
                                validation_dir=held_out, output=output, seed=3, workers=1, verbose=0,
                                callbacks=[Pause(output)])
    return (f"initial_epoch {result['initial_epoch']} epochs_run {len(result['history'].history.get('loss', []))} "
            f"best_epoch {result['best']['epoch']}")


if __name__ == "__main__":
    print(run(*sys.argv[1:6]), flush=True)
