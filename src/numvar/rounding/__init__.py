"""numvar.rounding"""
