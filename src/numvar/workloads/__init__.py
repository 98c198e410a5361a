"""numvar.workloads"""
