"""Augmenters: new training inputs made from the task's sentences, labelled by the teacher."""
