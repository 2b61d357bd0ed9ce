"""Measurements of the project beside the workflow: the scripts of this folder and the modules they import."""
