"""Training one ViT on many devices.

On JAX, `keras.distribution`: `data_parallel()` replicates the model and
splits batches; `model_parallel()` also splits every large weight over a
mesh axis with the Megatron-style `layout_map()`. On TensorFlow,
`tensorflow_strategy()` returns a `MirroredStrategy` (or a `TPUStrategy`)
for the same `model.fit` code. Jobs of many processes (JAX processes,
PyTorch under `torchrun`, TensorFlow workers) run through `engines`: one
module per engine behind one interface, chosen by `engines.current()`,
which says which process of a job this is.
`unsharded_weights()` and `layout_errors()` check a layout map against a
model before any memory is spent on it.
"""

from keras_vit.distribution.layout import (
    DEFAULT_MIN_SIZE,
    layout_errors,
    layout_map,
    sharding_rules,
    unsharded_weights,
)
from keras_vit.distribution.strategies import (
    data_parallel,
    distribution_for_backend,
    model_parallel,
    tensorflow_strategy,
)
