"""``kvprof bench``: one layer's K+V write per variant over a grid of shapes, against the device's limits."""
