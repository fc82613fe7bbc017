"""Facts: what a kernel or op is and does (kernels.py), what the device could do (peaks.py, torch_peaks.json),
interval arithmetic (intervals.py), numbers and tables as text (format.py), the JSON schemas' version (schema.py)."""
