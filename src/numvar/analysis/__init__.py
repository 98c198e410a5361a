"""numvar.analysis"""
