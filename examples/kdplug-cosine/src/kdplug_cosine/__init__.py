"""kdplug-cosine: cosine alignment of the top layers, a kdplug projector (see :mod:`kdplug_cosine.cosine`)."""

__version__ = "0.1.0"
