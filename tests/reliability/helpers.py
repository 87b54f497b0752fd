"""Shared makers for the reliability suite: hand-built files, tiny models."""

import json
import os
import struct

import numpy as np


def raw_safetensors(path, header, data=b"", header_bytes=None):
    """Write a safetensors-framed file with exactly this header (a dict, or raw bytes) and data."""
    encoded = header_bytes if header_bytes is not None else json.dumps(header, separators=(",", ":")).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)
    return path


def f32(*values):
    return np.asarray(values, np.float32).tobytes()


def tiny_backbone(**overrides):
    import keras_vit

    config = dict(image_size=8, patch_size=4, hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32)
    config.update(overrides)
    return keras_vit.ViTBackbone(**config)


def tiny_classifier(num_classes=3, **overrides):
    import keras_vit

    return keras_vit.ViTClassifier(tiny_backbone(**overrides), num_classes=num_classes)


def run_cli(argv, capsys):
    """`keras-vit ARGV` in this process: its exit code and what it printed on stderr."""
    from keras_vit import cli

    code = cli.main([str(arg) for arg in argv])
    return code, capsys.readouterr().err


def snapshot(root):
    """`{relative path: bytes, 'dir' or the link's target}` of everything under `root`."""
    found = {}
    for directory, directories, names in os.walk(root):
        for name in directories:
            found[os.path.relpath(os.path.join(directory, name), root)] = "dir"
        for name in names:
            path = os.path.join(directory, name)
            if os.path.islink(path):
                found[os.path.relpath(path, root)] = os.readlink(path)
                continue
            with open(path, "rb") as file:
                found[os.path.relpath(path, root)] = file.read()
    return found
