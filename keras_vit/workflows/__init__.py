"""The library behind the commands: train, fine-tune, pre-train, few-shot and the optimizer.

Workflows sit above models, presets and data in the import order and below
`commands/`: each `keras-vit` subcommand parses its flags and calls one of
these. `keras_vit.finetune`, `keras_vit.fewshot_evaluate` and
`keras_vit.optimizers` are the public names for what lives here.
"""
