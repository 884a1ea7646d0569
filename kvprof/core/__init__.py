"""kvprof's torch-free contract: file formats and vocabulary every other layer shares."""
