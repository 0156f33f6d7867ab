"""Flower's quickstart-pytorch with DCCO: see ../pyproject.toml."""
