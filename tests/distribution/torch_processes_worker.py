"""One process of a PyTorch training job: `python torch_processes_worker.py FOLDER OUT`, alone or under torchrun.

Alone, it trains a tiny classifier on every row of every batch of an image
folder. Under `torchrun --nproc_per_node=2`, each process joins the gloo
process group (`engines.torch_processes.join`), reads only its rows of every
global batch (`engine.shard`), and the callback of `engine.prepare`
averages the gradients before every update. Batches of 5 rows split 2 + 3,
so the average must weight each process by its rows to equal one process.
Process 0 writes the epoch losses (as the job logs them) and the final
weights to OUT as `.npz`.
"""

import os
import sys

FOLDER, OUT = sys.argv[1:3]
os.environ["KERAS_BACKEND"] = "torch"

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit.data import AugmentPolicy, EpochSync, image_folder_datasets  # noqa: E402
from keras_vit.distribution import engines  # noqa: E402
from keras_vit.distribution.engines import torch_processes  # noqa: E402
from keras_vit.utils.seeds import set_random_seed  # noqa: E402

if torch_processes.launched_by_torchrun():
    torch_processes.join()
engine = engines.current()
whole, _ = image_folder_datasets(FOLDER, 8, batch_size=5, validation_split=0, seed=0, workers=1,
                                 augment=AugmentPolicy())
train = engine.shard(whole)
assert whole.shard is None  # the caller's dataset is left whole
set_random_seed(engine.process_index())  # different seeds: prepare copies process 0's weights
model = keras_vit.ViTClassifier.from_variant(
    "ViT-Ti/16", image_size=8, patch_size=4, hidden_dim=16, num_layers=2, num_heads=4, mlp_dim=32,
    num_classes=2, dropout=0.0)
model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1, momentum=0.9),
              loss="sparse_categorical_crossentropy")
callbacks = [*engine.prepare(model, train), EpochSync(train)]
history = model.fit(train, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
weights = {w.path: keras.ops.convert_to_numpy(w.value) for w in model.weights}
if engine.is_chief():
    np.savez(OUT, losses=np.asarray(history.history["loss"]), **weights)
print(f"process {engine.process_index()} of {engine.process_count()}: losses {history.history['loss']}",
      flush=True)
