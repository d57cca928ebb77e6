"""The rules: pure numpy/pyarrow, no Ray, no I/O. Packing (concat, best_fit), long documents, masks,
side columns, token checks and the content digest."""
