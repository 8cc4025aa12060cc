"""Examples of a lab's own model and data set, named in an experiment config by import
string (docs/extensions.md)."""
