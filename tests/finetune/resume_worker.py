"""A fine-tuning run for the kill / resume test: `python resume_worker.py DATA PRESET OUTPUT EPOCHS`.

`SLOW_EPOCHS=seconds` pauses after each epoch so the test can kill the process mid-training.
"""

import os
import sys
import time

import keras

import keras_vit


class Pause(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        print(f"epoch {epoch + 1} done", flush=True)
        time.sleep(float(os.environ.get("SLOW_EPOCHS", "0")))


if __name__ == "__main__":
    data, preset, output, epochs = sys.argv[1:5]
    result = keras_vit.finetune(data, preset=preset, epochs=int(epochs), batch_size=8, recipe="adamw",
                                output=output, seed=3, workers=1, verbose=0, callbacks=[Pause()])
    print(f"initial_epoch {result['initial_epoch']} epochs_run {len(result['history'].history.get('loss', []))}",
          flush=True)
