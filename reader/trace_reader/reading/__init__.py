"""Reading: a trace file into a Trace (events.py: what the reader holds; files.py: the file, capped; fast_json.py:
msgspec's decoding; tree.py: the call tree, steps and launches)."""
