"""numvar.determinism"""
