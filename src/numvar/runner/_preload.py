"""Imported once by multiprocessing's fork server (``numvar.sample(jobs>1)``): workers
forked from it start with torch and numvar imported and dispatch modes warmed up."""

from .zygote import preload

preload()
