"""Cell state: the model, transaction validation, the store and its backends."""
