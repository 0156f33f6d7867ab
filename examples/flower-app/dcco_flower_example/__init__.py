"""DCCO in a Flower app of your own: see ../README.md."""
