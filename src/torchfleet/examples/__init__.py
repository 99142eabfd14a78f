"""The bundled example: a small transformer that learns multi-digit addition (``torchfleet fit``)."""
