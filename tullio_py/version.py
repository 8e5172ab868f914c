"""The version of tullio_py (part of the on-disk cache key and generated code headers)."""
__version__ = "0.1.0"
