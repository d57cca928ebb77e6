"""Where a run's output goes and how it becomes visible: one module per kind of output, behind the
methods :func:`raypack.pack.publish.run_published` calls (acquire, check_free, recover, prepare,
sweep, publish, after_failure, ...), chosen by :func:`raypack.pack.publish.output_target`.

* :mod:`.directory`: a local directory, published by one atomic rename of a staging directory;
* :mod:`.object_store`: a prefix of an object store, where the manifest, written last, is the commit;
* :mod:`.base`: what both refuse alike.
"""
