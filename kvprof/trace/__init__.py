"""Trace readers and the normalized event table."""
