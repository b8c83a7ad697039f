"""First-party kdplug plugins: models."""
