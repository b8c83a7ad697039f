"""First-party kdplug plugins: recipes."""
