"""Quantized layers of a keras_vit model, kept in its config as Keras' `DTypePolicyMap`.

`Quantization` is a mixin of `ViTModel`. Keras' `model.quantize("int8")`
gives each quantized layer a quantized dtype policy and saves its int8
kernel and scale; a model rebuilt from its config must build the same
layers quantized before those weights load. Keras' own mechanism does that,
as keras-hub's backbones use it: the config's `dtype` is a
`keras.dtype_policies.DTypePolicyMap` from each quantized layer's path to
its policy (the model's policy is the map's default). Every layer is built
with that map as its dtype and looks up its own path when it is built, so
the layers the map names are built quantized; the others get the default.
"""

import gc

import keras

DTypePolicyMap = keras.dtype_policies.DTypePolicyMap


def own_policy(layer):
    """The dtype policy of one layer, looked up by its path when it holds a map."""
    policy = layer.dtype_policy
    if isinstance(policy, DTypePolicyMap) and layer.path:
        return policy[layer.path]
    return policy


def default_policy(policy):
    """A plain dtype policy: the default of a `DTypePolicyMap`, or `policy` itself."""
    return policy.default_policy if isinstance(policy, DTypePolicyMap) else policy


class Quantization:
    """What `model.quantize(...)` changed, and the dtype config that rebuilds it (a mixin of `ViTModel`)."""

    def quantize(self, mode, **kwargs):
        """`keras.Model.quantize`, with one garbage collection instead of one per layer.

        Keras collects garbage each time a quantized layer drops its float
        kernel, to free that memory at once; with TensorFlow loaded each
        collection walks every Python object, and a ViT-B/16's 50 layers
        spent most of 36 s there. The objects that existed before the call
        are frozen for its duration (`gc.freeze`), so those collections walk
        only what quantization made; one full collection at the end frees
        the dropped kernels, as Keras intends.

        Args:
            mode: str. The quantization mode, e.g. `"int8"`.
            **kwargs: passed to `keras.Model.quantize`.
        """
        gc.freeze()
        try:
            return super().quantize(mode, **kwargs)
        finally:
            gc.unfreeze()
            gc.collect()

    def quantized_layers(self):
        """`{path inside this model: mode}` of every layer `model.quantize(...)` changed.

        Nested models included (a classifier lists its backbone's layers
        too); an empty dict for a float model.
        """
        return {
            self._path_inside(layer): layer.quantization_mode
            for layer in self._flatten_layers(include_self=False)
            if layer.quantization_mode
        }

    def _path_inside(self, layer):
        # Layers built inside a model's scope carry its path as a prefix; functional ones do not.
        path, prefix = layer.path or "", f"{self.path}/"
        return path[len(prefix):] if path.startswith(prefix) else path

    def _own_layers(self):
        """This model's layers, without those of a nested keras_vit model (its config holds their policies)."""
        nested = [layer for layer in self._flatten_layers(include_self=False) if isinstance(layer, Quantization)]
        inside = {id(layer) for model in nested for layer in model._flatten_layers(include_self=True)}
        return [layer for layer in self._flatten_layers(include_self=False) if id(layer) not in inside]

    def dtype_config(self):
        """The serialized dtype of `get_config`: the model's policy, or a `DTypePolicyMap` when layers are quantized.

        The map's keys are the quantized layers' own paths (the key a layer
        looks up when it is built); its default is the model's policy.
        """
        policy = default_policy(self.dtype_policy)
        quantized = sorted(((layer.path, own_policy(layer)) for layer in self._own_layers()
                            if layer.path and layer.quantization_mode), key=lambda item: item[0])
        if not quantized:
            return keras.dtype_policies.serialize(policy)
        policy_map = DTypePolicyMap(default_policy=policy)
        for path, layer_policy in quantized:
            policy_map[path] = layer_policy
        return keras.dtype_policies.serialize(policy_map)
