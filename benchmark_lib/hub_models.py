"""Small keras_hub task models with random weights, and one batch of their inputs.

Each is built from its backbone's constructor (nothing is downloaded) and fed token ids
or images directly (no preprocessor):

- ``llama``: ``LlamaCausalLM`` on a ``LlamaBackbone``, a decoder-only language model with
  grouped-query attention (8 query heads sharing 2 key/value heads) and rotary position
  embeddings; 4 layers, width 256, vocabulary 8000, sequence 128, batch 16; the labels
  are token ids, one per position;
- ``bert``: ``BertTextClassifier`` on a ``BertBackbone``, an encoder with learned
  positions and dropout 0.1; 4 layers, width 256, 4 heads, vocabulary 8000, sequence
  128, batch 32, 10 classes;
- ``vit``: ``ViTImageClassifier`` on a ``ViTBackbone``, a vision transformer on 64 x 64
  images cut in 8 x 8 patches (64 tokens and a class token); 4 layers, width 256,
  4 heads, batch 32, 10 classes.

keras_hub is an optional extra. ``pip install keras-hub`` pulls in tensorflow-text,
which pulls in the full ``tensorflow`` beside ``tensorflow-cpu``; what these models need
installs with :data:`INSTALL`.
"""
import importlib.util

__all__ = ["MODELS", "INSTALL", "missing", "build", "batch"]

#: Installs keras_hub and the one dependency its import needs, without tensorflow-text.
INSTALL = "pip install --no-deps keras-hub tokenizers"
SEQUENCE = 128
CLASSES = 10
#: Each model's backbone options and its batch.
MODELS = {
    "llama": {"backbone": {"vocabulary_size": 8000, "num_layers": 4, "num_query_heads": 8,
                           "num_key_value_heads": 2, "hidden_dim": 256,
                           "intermediate_dim": 704},
              "batch": 16},
    "bert": {"backbone": {"vocabulary_size": 8000, "num_layers": 4, "num_heads": 4,
                          "hidden_dim": 256, "intermediate_dim": 1024,
                          "max_sequence_length": SEQUENCE},
             "batch": 32},
    "vit": {"backbone": {"image_shape": (64, 64, 3), "patch_size": 8, "num_layers": 4,
                         "num_heads": 4, "hidden_dim": 256, "mlp_dim": 1024},
            "batch": 32},
}


def missing():
    """Why the keras_hub models cannot be built here, or None when they can (checked
    without importing TensorFlow)."""
    absent = [name for name in ("keras_hub", "tokenizers")
              if importlib.util.find_spec(name) is None]
    if absent:
        return f"{' and '.join(absent)} not installed ({INSTALL})"
    return None


def build(name):
    """The task model ``name`` of :data:`MODELS`, with random weights."""
    import keras_hub  # pylint: disable=import-outside-toplevel

    options = MODELS[name]["backbone"]
    if name == "llama":
        return keras_hub.models.LlamaCausalLM(keras_hub.models.LlamaBackbone(**options))
    if name == "bert":
        return keras_hub.models.BertTextClassifier(keras_hub.models.BertBackbone(**options),
                                                   num_classes=CLASSES)
    return keras_hub.models.ViTImageClassifier(keras_hub.models.ViTBackbone(**options),
                                               num_classes=CLASSES)


def batch(name, size, rng):
    """One batch ``(x, y)`` of ``size`` for model ``name``, drawn from the numpy
    ``RandomState`` ``rng``: the inputs its backbone takes, and labels."""
    if name == "vit":
        images = rng.rand(size, *MODELS[name]["backbone"]["image_shape"]).astype("float32")
        return images, rng.randint(0, CLASSES, size)
    vocabulary = MODELS[name]["backbone"]["vocabulary_size"]
    tokens = rng.randint(1, vocabulary, (size, SEQUENCE)).astype("int32")
    x = {"token_ids": tokens, "padding_mask": tokens > 0}
    if name == "bert":
        x["segment_ids"] = tokens * 0
        return x, rng.randint(0, CLASSES, size)
    return x, rng.randint(1, vocabulary, (size, SEQUENCE)).astype("int32")
