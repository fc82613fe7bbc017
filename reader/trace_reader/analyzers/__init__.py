"""Analyzers: one question each, on a Trace (steps, annotations, lag, compiled regions, memory, training, ranks,
collectives, modules, data parallel, the report as data), each rung's guesses beside what they read."""
