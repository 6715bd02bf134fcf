"""The TPU VM scripts (create, setup, run); see launch/__init__.py for the two ways to run them."""
