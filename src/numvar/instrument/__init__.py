"""numvar.instrument"""
