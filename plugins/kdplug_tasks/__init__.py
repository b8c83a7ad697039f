"""First-party kdplug plugins: tasks."""
