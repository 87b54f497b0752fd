"""Stems for hybrid ViTs: a CNN whose feature map is cut into patches.

The hybrid of the paper (section 3.1) is an ordinary `ViTBackbone` with a
`stem`: the CNN maps normalised images to a feature map `(batch, h, w, c)`,
`Patches(patch_size)` cuts it (1x1 patches in the paper's hybrids) and the
same `PatchEncoder` projects each patch to the token width. The builders
here make such stems: the BiT ResNet of the paper, `keras.applications`
CNNs, and keras-cv's `ResNetV2Backbone`. Any other Keras model that maps
images to a 4-D feature map works as well.

Images are `(batch, height, width, channels)` whatever
`keras.config.image_data_format()` says, so every stem built here is
channels-last: the BiT layers state their layout, and the Keras CNNs are
built under `channels_last` (their layers take the global format when they
are constructed and keep it in their config).
"""

import contextlib

import keras

from keras_vit.layers.bit_bottleneck_unit import BiTBottleneckUnit
from keras_vit.layers.bit_root import BiTRoot
from keras_vit.utils.values import check_count, check_counts


@contextlib.contextmanager
def _channels_last():
    """Construct Keras layers channels-last, then give the global image data format back."""
    previous = keras.config.image_data_format()
    keras.config.set_image_data_format("channels_last")
    try:
        yield
    finally:
        keras.config.set_image_data_format(previous)


def bit_resnet_stem(
    stage_depths=(3, 4, 9),
    width=64,
    num_groups=32,
    std_conv_epsilon=1e-8,
    group_norm_epsilon=1e-5,
    freeze=False,
    name="bit_resnet",
    dtype=None,
):
    """The BiT ResNet that feeds the paper's hybrid ViTs.

    A `BiTRoot` (7x7/2 StdConv, GroupNorm, ReLU, 3x3/2 max-pool), then one
    stage of `BiTBottleneckUnit`s per entry of `stage_depths`. Stage `i`
    outputs `4 * width * 2**i` channels; the first stage keeps the
    resolution and every later one halves it, so three stages give an
    output stride of 16 (R50+ViT-B/16: `(3, 4, 9)`) and four give 32
    (R50: `(3, 4, 6, 3)`, R26: `(2, 2, 2, 2)`). An empty `stage_depths`
    leaves the root alone (output stride 4, `width` channels), as in
    R+ViT-Ti/16. This is timm's `ResNetV2(preact=False, stem_type="same",
    conv_layer=StdConv2dSame)` of `vision_transformer_hybrid.py`.

    Layer names follow the Google checkpoints: `root`, then
    `block{stage}_unit{unit}` counting from 1.

    Args:
        stage_depths: tuple of ints. Units per stage. Defaults to
            `(3, 4, 9)`.
        width: int. Channels of the root; the bottleneck width of the
            first stage. Defaults to `64`.
        num_groups: int. GroupNorm groups. Defaults to `32`.
        std_conv_epsilon: float. Weight-standardisation epsilon. Defaults
            to `1e-8` (timm).
        group_norm_epsilon: float. GroupNorm epsilon. Defaults to `1e-5`
            (timm).
        freeze: bool. Build the stem non-trainable (see
            `set_stem_trainable` to unfreeze it later). Defaults to `False`.
        name: str. Defaults to `"bit_resnet"`.
        dtype: dtype policy of the layers. Defaults to the global policy.

    Returns:
        A `keras.Sequential` to pass as `ViTBackbone(stem=...)`.

    Example:

    >>> stem = keras_vit.models.bit_resnet_stem((3, 4, 9))
    >>> backbone = keras_vit.ViTBackbone(image_size=224, patch_size=1, stem=stem)
    """
    check_counts(stage_depths, "stage_depths", what=", one per stage (empty for the root alone)")
    check_count(width, "width")
    options = dict(
        num_groups=num_groups, std_conv_epsilon=std_conv_epsilon, group_norm_epsilon=group_norm_epsilon, dtype=dtype
    )
    layers = [BiTRoot(width, name="root", **options)]
    for stage, depth in enumerate(stage_depths):
        for unit in range(depth):
            layers.append(
                BiTBottleneckUnit(
                    4 * width * 2**stage,
                    strides=2 if stage > 0 and unit == 0 else 1,
                    bottleneck_filters=width * 2**stage,
                    name=f"block{stage + 1}_unit{unit + 1}",
                    **options,
                )
            )
    stem = keras.Sequential(layers, name=name)
    stem.trainable = not freeze
    return stem


def applications_stem(application="ResNet50V2", num_channels=3, weights=None, freeze=False, name=None, **kwargs):
    """A `keras.applications` CNN without its top, as a hybrid stem.

    The model receives the backbone's normalised images (by default in
    [-1, 1], the range `keras.applications.resnet_v2` expects), so no
    preprocessing is added. The feature map has the CNN's output stride
    (32 for ResNet50V2: a 224 image gives 7x7 tokens with `patch_size=1`).

    Args:
        application: str or callable. A `keras.applications` constructor
            name such as `"ResNet50V2"`, or the constructor itself.
            Defaults to `"ResNet50V2"`.
        num_channels: int. Input channels. Defaults to `3`.
        weights: `None`, `"imagenet"` or a path, as in
            `keras.applications` (`"imagenet"` needs 3 channels and
            downloads). Defaults to `None` (random initialisation).
        freeze: bool. Build the stem non-trainable; its BatchNorm layers
            then run in inference mode. Defaults to `False`.
        name: str or `None`. Model name; `None` keeps the application's.
        **kwargs: Other arguments of the constructor (e.g. `pooling`).

    Returns:
        A functional `keras.Model` mapping `(batch, height, width,
        num_channels)` images to a feature map.
    """
    constructor = application
    if isinstance(application, str):
        constructor = getattr(keras.applications, application, None)
        if constructor is None or not callable(constructor):
            raise ValueError(
                f"Unknown keras.applications model {application!r}. Use a name such as 'ResNet50V2', "
                f"'ResNet101V2' or 'ConvNeXtTiny'. Received: application={application!r}"
            )
    if name is not None:
        kwargs["name"] = name
    with _channels_last():
        model = constructor(include_top=False, weights=weights, input_shape=(None, None, num_channels), **kwargs)
    model.trainable = not freeze
    return model


def keras_cv_resnet_v2_stem(
    stackwise_filters=(64, 128, 256, 512),
    stackwise_blocks=(3, 4, 6, 3),
    stackwise_strides=(1, 2, 2, 2),
    num_channels=3,
    preset=None,
    freeze=False,
    **kwargs,
):
    """keras-cv's `ResNetV2Backbone` as a hybrid stem (the `cv` extra).

    Args:
        stackwise_filters: tuple of ints. Bottleneck width per stack.
            Defaults to ResNet50V2's `(64, 128, 256, 512)`.
        stackwise_blocks: tuple of ints. Blocks per stack; keras-cv 0.9
            needs at least 2 per stack (with 1 it names two layers alike).
            Defaults to `(3, 4, 6, 3)`.
        stackwise_strides: tuple of ints. Stride per stack. Defaults to
            `(1, 2, 2, 2)`.
        num_channels: int. Input channels. Defaults to `3`.
        preset: str or `None`. A keras-cv preset (downloads weights)
            instead of the stack arguments. Defaults to `None`.
        freeze: bool. Build the stem non-trainable. Defaults to `False`.
        **kwargs: Other `ResNetV2Backbone` arguments.

    Returns:
        A `keras_cv.models.ResNetV2Backbone`.

    Raises:
        ImportError: if keras-cv is not installed.
    """
    try:
        import keras_cv
    except ImportError as error:  # optional dependency
        raise ImportError(
            "keras_cv_resnet_v2_stem needs keras-cv: `pip install keras-cv`."
        ) from error
    if preset is None and any(blocks < 2 for blocks in stackwise_blocks):
        raise ValueError(
            "keras-cv's ResNetV2Backbone needs at least 2 blocks per stack (with 1 it builds two layers "
            f"with the same name). Received: stackwise_blocks={tuple(stackwise_blocks)}"
        )
    with _channels_last():
        if preset is not None:
            model = keras_cv.models.ResNetV2Backbone.from_preset(
                preset, input_shape=(None, None, num_channels), **kwargs
            )
        else:
            kwargs.setdefault("include_rescaling", False)
            model = keras_cv.models.ResNetV2Backbone(
                stackwise_filters=list(stackwise_filters),
                stackwise_blocks=list(stackwise_blocks),
                stackwise_strides=list(stackwise_strides),
                input_shape=(None, None, num_channels),
                **kwargs,
            )
    model.trainable = not freeze
    return model


def set_stem_trainable(model, trainable=True):
    """Freeze or unfreeze the CNN stem of a hybrid backbone or classifier.

    Typical use: train the Transformer with a frozen pre-trained stem for a
    few epochs, then unfreeze it. As always in Keras, call `compile()`
    again after changing `trainable` so the change reaches training.

    Args:
        model: `ViTBackbone`, or a model with a `backbone` attribute
            (`ViTClassifier`).
        trainable: bool. Defaults to `True`.

    Returns:
        The stem.

    Raises:
        ValueError: if the model has no stem.
    """
    backbone = getattr(model, "backbone", model)
    stem = getattr(backbone, "stem", None)
    if stem is None:
        raise ValueError(
            f"Model {model.name!r} has no CNN stem; only hybrid backbones (built with `stem=`) have one."
        )
    stem.trainable = trainable
    return stem
