"""Benchmarks for Vigil; run each as a module, e.g. ``python -m bench.transport`` (see its docstring)."""
