"""Optional integrations with one framework, imported only when that backend runs.

The model code uses `keras.ops` alone; what Keras leaves to the framework and
a feature needs anyway (the global random generator that resuming a torch run
must restore, torch's fused Adam kernel for `keras_vit.optimizers.AdamW`)
lives here, each import of the framework inside a function.
"""
