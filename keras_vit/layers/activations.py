"""The MLP activations that ViT checkpoints use, by the names a config gives them.

`"gelu"` is the exact (erf) GELU of the paper, timm's `nn.GELU` and Hugging
Face's `"gelu"`; `"gelu_tanh"` is its tanh approximation (big_vision's
`nn.gelu` default, Hugging Face's `"gelu_pytorch_tanh"` in SigLIP);
`"quick_gelu"` is OpenAI CLIP's `x * sigmoid(1.702 x)`. The three differ at
the 1e-4 level or more, enough to break parity with converted weights, so a
model names the one its weights were trained with.
"""

import keras
from keras import ops

from keras_vit.utils.values import check_choice

ACTIVATIONS = ("gelu", "gelu_tanh", "quick_gelu")


def quick_gelu(x):
    """CLIP's GELU approximation, `x * sigmoid(1.702 x)`."""
    return x * ops.sigmoid(ops.cast(1.702, x.dtype) * x)


def gelu_tanh(x):
    """GELU with the tanh approximation (`0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`)."""
    return keras.activations.gelu(x, approximate=True)


def gelu_exact(x):
    """The exact GELU, `x * Phi(x)` with the erf form of the normal CDF."""
    return keras.activations.gelu(x, approximate=False)


_FUNCTIONS = {"gelu": gelu_exact, "gelu_tanh": gelu_tanh, "quick_gelu": quick_gelu}


def check_activation(name, argument="activation"):
    """Refuse an activation name that is not one of `ACTIVATIONS`."""
    check_choice(name, ACTIVATIONS, argument)


def get_activation(name):
    """The function of a named MLP activation (`"gelu"`, `"gelu_tanh"` or `"quick_gelu"`)."""
    check_activation(name)
    return _FUNCTIONS[name]
