"""numvar.bounds"""
