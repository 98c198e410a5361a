"""Realizations of a function or of an unmodified script: capture, storage, executors."""

from .store import RunStore, Samples, load_run

__all__ = ["RunStore", "Samples", "load_run"]
