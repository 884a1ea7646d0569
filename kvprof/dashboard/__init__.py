"""kvprof dashboard: a Streamlit + Plotly view of what ``python -m kvprof analyze`` writes.

Modules: app (entry, sidebar, navigation), data (finding runs, path checks, cached
reads of summary.json / writes.parquet / events.parquet, running the analyze pipeline
when a run lacks them), frames (pure DataFrame shaping), charts (pure Plotly figure
builders), ui (Streamlit helpers for exports), views/* (one module per page).
"""
