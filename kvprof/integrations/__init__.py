"""kvprof inside other programs (serving engines), loaded through their own plugin systems."""
