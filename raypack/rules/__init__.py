"""The rules: pure numpy/pyarrow, no Ray, no I/O. What every strategy shares: packing a stream
(core: concat's exact rules, fragments), long documents, masks, side columns, token checks and the
content digest. A rule only one strategy uses lives in its folder (raypack/strategies/best_fit/rules.py)."""
