"""Renderers only: they format what kvprof.analysis computed and never compute numbers."""
