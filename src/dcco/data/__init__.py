"""Data: loaders (``datasets``) and client partitioning (``partition``)."""
