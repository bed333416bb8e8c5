"""Package version (read by pyproject.toml and written into every HDF5 file)."""

__version__ = "0.1.0"
