"""What an export directory *is*: the contract between ``export/`` (which writes one) and ``runtime/`` (which runs
one), below both.

* ``layout``        the entries' names: ``manifest.json``, ``onnx/`` graphs, ``engines/``, ``plugin/``, ``tokenizer/``
* ``export_dir``    ``ExportDir``: one export directory, read and written through its one manifest (older
                    exports, with ``onnx/onnx_export.json``, read too)
* ``manifest``      the manifest as a dict: ``new_manifest``, ``graph_io``, ``file_records``, ``check_manifest``,
                    format and op-contract version checks
* ``drafter_io``    the drafter graphs' I/O names and their interface check
* ``target_io``     the target graph's I/O names, K/V interface and the manifest's ``target`` section
* ``external_data`` graphs whose weights live in ``<graph>.onnx.data``: references, checks, sharing
* ``kv_capacity``   the capacity buckets of the exported target's K/V cache
"""
