"""The scale-up scenario benchmark (`python -m bench.scaleup`): see `__main__.py`."""
