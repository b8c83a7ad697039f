"""First-party kdplug plugins: methods."""
