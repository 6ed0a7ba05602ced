"""A new model of another's config, for the recipes that build one from two (WiSE-FT) or merge one (LoRA)."""

import keras


def blank_copy(model):
    """A new, built model of `model`'s config (its compile state aside), with freshly initialised
    weights and `model`'s tokenizer and preprocessor."""
    config = keras.saving.serialize_keras_object(model)
    config.pop("compile_config", None)  # the copy is compiled by its user, if trained
    copy = keras.saving.deserialize_keras_object(config)
    copy.tokenizer, copy.preprocessor = model.tokenizer, model.preprocessor
    return copy
